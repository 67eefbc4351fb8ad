"""Memory: MEMORY.md, daily notes, HISTORY consolidation, structured items and budgeted retrieval.

The names of the read path (the embedder, the vectors, the ``# Memory`` section), which load numpy, are
imported at their first use, through ``__getattr__``: a bot with ``memory.enabled = false`` uses none
of them, and does not hold numpy (bot/memory/reading.py).
"""

from __future__ import annotations

import importlib
import typing

from bot.memory import operator
from bot.memory.archive import TranscriptArchive
from bot.memory.consolidation import CONSOLIDATION_OUTPUT, ConsolidationResult
from bot.memory.items import ItemType, Layer, MemoryItem, Reference, ScoredItem
from bot.memory.longterm import Limits, LongTermMemory
from bot.memory.longterm_errors import Conflict, MemoryFull, NotUtf8
from bot.memory.pack import MemoryPack
from bot.memory.prompt import system_prompt
from bot.memory.recorder import CONVERSATION_KEY, Exchange
from bot.memory.service import MemoryService
from bot.memory.tool import MemoryTool

if typing.TYPE_CHECKING:
    from bot.memory.embeddings import Embedder, build_embedder
    from bot.memory.section import MemoryContext
    from bot.memory.vectors import VECTORS_DIR, VectorStore

_ON_FIRST_USE = {
    "Embedder": "bot.memory.embeddings",
    "build_embedder": "bot.memory.embeddings",
    "MemoryContext": "bot.memory.section",
    "VECTORS_DIR": "bot.memory.vectors",
    "VectorStore": "bot.memory.vectors",
}


def __getattr__(name: str) -> object:
    """A name of ``_ON_FIRST_USE``, imported now (see the module doc)."""
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
    globals()[name] = value  # the next use finds it here
    return value


__all__ = [
    "CONSOLIDATION_OUTPUT",
    "CONVERSATION_KEY",
    "VECTORS_DIR",
    "Conflict",
    "ConsolidationResult",
    "Embedder",
    "Exchange",
    "ItemType",
    "Layer",
    "Limits",
    "LongTermMemory",
    "MemoryContext",
    "MemoryFull",
    "MemoryItem",
    "MemoryPack",
    "MemoryService",
    "MemoryTool",
    "NotUtf8",
    "Reference",
    "ScoredItem",
    "TranscriptArchive",
    "VectorStore",
    "build_embedder",
    "operator",
    "system_prompt",
]
