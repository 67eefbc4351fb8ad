"""The ordered systems of a turn: the pipeline that runs them, and the five the composition root builds."""

from pipeline.base import System, SystemFailure, Turn
from pipeline.compaction import AutoCompactionSystem
from pipeline.context import ContextBuildingSystem
from pipeline.memory_persist import MemoryPersistSystem
from pipeline.pipeline import Pipeline
from pipeline.tool_loop import ToolLoopSystem
from pipeline.usage import UsageSystem

__all__ = [
    "AutoCompactionSystem",
    "ContextBuildingSystem",
    "MemoryPersistSystem",
    "Pipeline",
    "System",
    "SystemFailure",
    "ToolLoopSystem",
    "Turn",
    "UsageSystem",
]
