"""The retire path: messages leaving a session are archived, then consolidated into HISTORY and MEMORY.md.

The facts a consolidation finds are stored as episodic items too, so retrieval finds them beside what
was said. Compaction and ``/new`` await :meth:`Retirement.consolidate`; the running bot's trims start
it in the background (:meth:`Retirement.in_background`), and :meth:`Retirement.close` waits for those.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime

import structlog

from bot.config import MemorySettings
from bot.domain import Message, Role, Session
from bot.memory.archive import TranscriptArchive
from bot.memory.consolidation import ConsolidationResult, Consolidator
from bot.memory.item_store import ItemStore
from bot.memory.items import Layer, MemoryItem, Reference, make_title
from bot.memory.lazy_sync import LazySync
from bot.memory.longterm import LongTermMemory
from bot.memory.upkeep import Upkeep

log = structlog.get_logger(__name__)


class Retirement:
    """Archives and consolidates what leaves a session, awaited or in the background.

    ``longterm_for`` picks the MEMORY.md a session's consolidation writes (the chat's own in chat
    scope); ``lazy`` is the write path's lazy sync, flushed before anything is archived.
    """

    def __init__(
        self,
        archive: TranscriptArchive,
        consolidator: Consolidator,
        items: ItemStore,
        upkeep: Upkeep,
        settings: MemorySettings,
        *,
        lazy: LazySync,
        longterm_for: Callable[[str], LongTermMemory],
        clock: Callable[[], datetime],
    ) -> None:
        self._archive = archive
        self._consolidator = consolidator
        self._items = items
        self._upkeep = upkeep
        self._settings = settings
        self._lazy = lazy
        self._longterm_for = longterm_for
        self._clock = clock
        self._tasks: set[asyncio.Task[ConsolidationResult]] = set()

    async def archive_messages(self, session_id: str, messages: Sequence[Message]) -> int:
        """Keep ``messages`` in the archive before they leave the session; what was recorded of them
        without an fsync is synced first (the next start can only record again what a session holds)."""
        if self._lazy.pending:
            await self._lazy.sync()
        return await self._archive.append(session_id, messages, self._clock())

    async def consolidate(
        self,
        session: Session | str,
        messages_to_retire: Sequence[Message],
        *,
        timeout: float | None = None,
    ) -> ConsolidationResult:
        """Archive, then consolidate ``messages_to_retire`` into HISTORY/MEMORY.md; awaited.

        In chat scope the MEMORY.md is the chat's own (``longterm_for``), never the operator's.

        Used by compaction and ``/new``. On timeout or failure a raw-fallback entry is written and
        ``result.raw_fallback`` is True; the caller may drop the messages from the session either way.
        """
        session_id = session if isinstance(session, str) else session.id
        archived = await self.archive_messages(session_id, messages_to_retire)
        wait = self._settings.consolidation_timeout if timeout is None else timeout
        result = await self._consolidator.run(
            session_id, messages_to_retire, timeout=wait, longterm=self._longterm_for(session_id)
        )
        result.archived = archived
        await self._store_facts(session_id, messages_to_retire, result)
        self._upkeep.start_when_due()
        return result

    def in_background(
        self, session_id: str, messages_to_retire: Sequence[Message]
    ) -> asyncio.Task[ConsolidationResult]:
        """Start :meth:`consolidate` without waiting; :meth:`close` waits for it."""
        task = asyncio.create_task(
            self.consolidate(session_id, list(messages_to_retire)), name=f"consolidate:{session_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[ConsolidationResult]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("consolidation_crashed", error=repr(task.exception()))

    @property
    def pending(self) -> int:
        """Background consolidations not finished yet."""
        return len(self._tasks)

    async def close(self) -> None:
        """Wait for background consolidations (each has its own deadline, so this ends)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _store_facts(
        self, session_id: str, messages: Sequence[Message], result: ConsolidationResult
    ) -> None:
        if not result.facts:
            return
        now = self._clock()
        refs = tuple(Reference(session_id, m.id) for m in messages if m.role is Role.USER)[:20]
        items = [
            MemoryItem(
                layer=Layer.EPISODIC,
                type=fact.type,
                title=make_title(fact.content),
                content=fact.content,
                source="consolidation",
                confidence=fact.confidence,
                salience=0.75,
                created_at=now,
                updated_at=now,
                last_accessed_at=now,
                references=refs or (Reference(session_id),),
            )
            for fact in result.facts
        ]
        await self._upkeep.promote(await self._items.add_many(items))
