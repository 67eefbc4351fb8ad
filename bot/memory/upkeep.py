"""Item upkeep: promoting what was just written, and the running bot's promote, decay and compact pass."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import structlog

from bot.config import MemorySettings
from bot.memory.item_store import ItemStore
from bot.memory.items import MemoryItem

if TYPE_CHECKING:  # only with retrieval (it loads numpy: see reading.py)
    from bot.memory.retrieval import Retriever

log = structlog.get_logger(__name__)


class Upkeep:
    """Keeps the item layers in shape after writes.

    Every write promotes its own new items (:meth:`promote`). :meth:`maintain` promotes, decays and
    compacts all of them; with ``every`` set (the running bot) it does so that often, in the background
    (:meth:`start_when_due`), checked after each answer and each consolidation. Not after every
    consolidation: an active chat consolidates every ~20 exchanges, and at 100,000 items a maintenance
    with nothing to do took ~3 s, 1.5 s of them holding up every chat's turns (``bench/memory_scale.py``
    prints it). Operator commands and the bench leave ``every`` ``None``, so that they never rewrite
    item logs behind the bot's back.
    """

    def __init__(
        self,
        items: ItemStore,
        retriever: Retriever | None,
        settings: MemorySettings,
        *,
        clock: Callable[[], datetime],
        every: timedelta | None = None,
    ) -> None:
        self._items = items
        self._retriever = retriever
        self._settings = settings
        self._clock = clock
        self._every = every
        self._maintained_at: datetime | None = None
        self._running: asyncio.Task[None] | None = None  # started by start_when_due

    async def promote(self, candidates: Sequence[MemoryItem]) -> None:
        """Promote what was just written, if confident enough (never a scan of every item)."""
        await self._items.promote(self._clock(), self._settings.promotion_confidence, candidates)

    async def maintain(self) -> dict[str, int]:
        """Promotion, decay and log compaction: in-memory scans plus a write only for what changed."""
        now = self._clock()
        await self._items.flush_touches()
        promoted = await self._items.promote(now, self._settings.promotion_confidence)
        decayed = await self._items.decay(now, self._settings.decay_days)
        compacted = await self._items.compact()
        await self._items.save_snapshot()
        if self._retriever is not None:  # None: memory is off, and has no word index to keep
            await self._retriever.save()
        return {"promoted": len(promoted), "decayed": decayed, "compacted": compacted}

    def start_when_due(self) -> None:
        """:meth:`run` in the background once ``every`` has passed since the last run (the running bot).

        Not awaited where it is due, after an answer's or a consolidation's writes: a reply waits for
        its turn's writes, and at 100,000 items the first maintenance after a start took 2.4 s (9 s on
        a day everything decays). :meth:`settled` waits for it."""
        if self._running is not None and not self._running.done():
            return
        if self._due():
            self._running = asyncio.create_task(self._run_logged(), name="memory-maintenance")

    async def settled(self) -> None:
        """Return once a maintenance started by :meth:`start_when_due` has finished."""
        if self._running is not None:
            await asyncio.shield(self._running)

    async def _run_logged(self) -> None:
        try:
            await self.run(when_due=True)
        except Exception:  # a background task outlives any failure; it logs it
            log.exception("memory_maintenance_failed")

    def _due(self) -> bool:
        every, last = self._every, self._maintained_at
        return every is not None and (last is None or self._clock() - last >= every)

    async def run(self, *, when_due: bool = False) -> None:
        """:meth:`maintain` for the running bot only (``every`` set); ``when_due`` waits for ``every``
        since the last run. A failure is logged, never the user's problem."""
        if self._every is None or (when_due and not self._due()):
            return
        self._maintained_at = self._clock()
        try:
            report = await self.maintain()
        except OSError as exc:
            log.error("memory_maintenance_failed", error=repr(exc))
            return
        if any(report.values()):
            log.info("memory_maintained", **report)

    async def close(self) -> None:
        """The running bot writes which items were recalled since the last maintenance."""
        await self.settled()
        if self._every is not None:
            try:
                await self._items.flush_touches()
            except OSError as exc:
                log.error("memory_touches_not_saved", error=repr(exc))
