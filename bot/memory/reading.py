"""ReadPath: the part of memory that finds things for a query, built only when memory is on.

It is the word index and ranking (retrieval.py, over lexical.py's BM25 with simplemma's lemmas), the
vectors (vectors.py), the ``## Relevant Memory`` pack (relevant.py) and the ``# Memory`` section
(section.py, with recent.py's notes). These load numpy and simplemma, about 20 MiB of a bot's memory, so
:class:`~bot.memory.service.MemoryService` imports this module only when it is asked to read: a bot
with ``memory.enabled = false`` keeps its archive and consolidation fallbacks without them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from bot.config import MemorySettings
from bot.memory.embeddings import Embedder
from bot.memory.item_index import embeddable
from bot.memory.item_store import ItemStore
from bot.memory.longterm import LongTermMemory
from bot.memory.recall import Recaller
from bot.memory.recent import RecentNotes
from bot.memory.relevant import RelevantMemory
from bot.memory.retrieval import Retriever
from bot.memory.scope import ChatFolders
from bot.memory.section import MemorySection
from bot.memory.vectors import VECTORS_DIR, VectorStore
from bot.memory.words import load_lemmas


class ReadPath:
    """What :meth:`MemoryService.search <bot.memory.service.MemoryService.search>`, ``pack`` and
    ``context`` use; ``start`` it after the items loaded, ``close`` it before they are saved."""

    def __init__(
        self,
        root: Path,
        items: ItemStore,
        recaller: Recaller,
        longterm: LongTermMemory,
        chats: ChatFolders,
        settings: MemorySettings,
        *,
        embedder: Embedder | None,
        tz: ZoneInfo,
        clock: Callable[[], datetime],
        chat_scope: bool,
        read_only: bool,
    ) -> None:
        self._items = items
        self.retriever = Retriever(items)
        self.vectors = (
            VectorStore(root / VECTORS_DIR, embedder, read_only=read_only) if embedder is not None else None
        )
        self.relevant = RelevantMemory(
            items, self.retriever, recaller, self.vectors, settings, tz=tz, clock=clock, chat_scope=chat_scope
        )
        if self.vectors is not None and not read_only:
            items.subscribe(self.relevant.embed_later)
        recent = RecentNotes(items, recaller, tz=tz, chat_scope=chat_scope)
        self.section = MemorySection(
            settings,
            longterm,
            chats,
            self.relevant,
            recent,
            recaller,
            tz=tz,
            clock=clock,
            chat_scope=chat_scope,
        )

    async def start(self, *, embed_missing: bool) -> None:
        """Load the lemmas, the word index and the vectors; ``embed_missing`` (the running bot) embeds,
        in the background, what has no vector yet (a new model, items imported beside the bot): the bot
        answers meanwhile with what it has."""
        await asyncio.to_thread(load_lemmas)
        await self.retriever.ready()
        if self.vectors is not None:
            await self.vectors.start()
            if embed_missing:
                self.vectors.submit(i for i in self._items.items() if embeddable(i))

    async def close(self) -> None:
        """Stop the embedding under way (a read-only one: the query embeddings)."""
        if self.vectors is not None:
            await self.vectors.close()
