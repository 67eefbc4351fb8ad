"""Memory: MEMORY.md, daily notes, HISTORY consolidation, structured items and budgeted retrieval."""

from bot.memory.consolidation import ConsolidationResult
from bot.memory.items import ItemType, Layer, MemoryItem, Reference
from bot.memory.pack import MemoryPack
from bot.memory.retrieval import ScoredItem
from bot.memory.service import Exchange, MemoryContext, MemoryService

__all__ = [
    "ConsolidationResult",
    "Exchange",
    "ItemType",
    "Layer",
    "MemoryContext",
    "MemoryItem",
    "MemoryPack",
    "MemoryService",
    "Reference",
    "ScoredItem",
]
