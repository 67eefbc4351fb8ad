"""The ordered systems of a turn."""

from pipeline.base import System, SystemFailure, Turn
from pipeline.pipeline import Pipeline

__all__ = ["Pipeline", "System", "SystemFailure", "Turn"]
