"""Memory: MEMORY.md, daily notes, HISTORY consolidation, structured items and budgeted retrieval."""

from bot.memory import operator
from bot.memory.archive import TranscriptArchive
from bot.memory.consolidation import CONSOLIDATION_OUTPUT, ConsolidationResult
from bot.memory.embeddings import Embedder, build_embedder
from bot.memory.items import ItemType, Layer, MemoryItem, Reference
from bot.memory.longterm import Conflict, Limits, LongTermMemory, MemoryFull, NotUtf8
from bot.memory.pack import MemoryPack
from bot.memory.prompt import system_prompt
from bot.memory.recorder import CONVERSATION_KEY, Exchange
from bot.memory.retrieval import ScoredItem
from bot.memory.section import MemoryContext
from bot.memory.service import MemoryService
from bot.memory.tool import MemoryTool
from bot.memory.vectors import VECTORS_DIR, VectorStore

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
