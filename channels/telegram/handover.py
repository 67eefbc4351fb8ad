"""Handing held Telegram updates over to the dispatcher, one at a time, in the order they arrived.

The update journal (:mod:`channels.telegram.journal`) holds every accepted update until the dispatcher
has it. :class:`HandOver` takes the held updates out in arrival order, runs the channel's intake on each
(access checks, media, the paste joiner) and releases the update from the journal once its message is
queued, or at once when it needed nothing. Failures are sorted by kind, because a full disk and a bug
need opposite treatment:

- storage (``OSError``, ``StorageError``): wait with backoff and try again, for as long as it takes;
  the outage is logged once. Dropping would lose the message, and a restart could not do better.
- anything else: tried ``max_attempts`` times, then the update is logged and released, so one message
  that cannot be processed does not block every later one.

When the channel stops, what was not handed over (not yet taken in, or not taken by ``submit`` before
the joiner closed) stays held and is taken in at the next start.

The updates held from an earlier run come first, and once they are all taken in ``resumed_done`` is
called: the channel hands on the paste they make at once, so a message that arrives after the start is
never joined to them. The dispatcher may have them already (a kill between its inbox's fsync and the
journal's release) and knows a joined message by its first update's message id: a new message joined
in would be dropped with the redelivery.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from channels.outage import StorageOutage, is_storage_error
from channels.telegram.inbound import NotTaken
from channels.telegram.journal import UpdateJournal

log = structlog.get_logger(__name__)

Intake = Callable[[dict[str, Any]], Awaitable["asyncio.Future[None] | None"]]
"""Takes one update in; returns a future that completes once its message is queued, or ``None`` when
there is nothing to queue."""


class HandOver:
    """Runs until cancelled (:meth:`run`); :meth:`drain` waits for the releases still pending."""

    def __init__(
        self,
        journal: UpdateJournal,
        intake: Intake,
        *,
        outage: StorageOutage,
        max_attempts: int,
        resumed: int = 0,
        resumed_done: Callable[[], None] = lambda: None,
    ) -> None:
        self._resumed = resumed  # held updates of an earlier run still to take in (they come first)
        self._resumed_done = resumed_done
        self._journal = journal
        self._intake = intake
        self._outage = outage
        self._max_attempts = max_attempts
        self._releases: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        while True:
            update = dict(await self._journal.next())
            await self._hand_over(update)
            if self._resumed > 0:
                self._resumed -= 1
                if self._resumed == 0:
                    self._resumed_done()

    async def drain(self) -> None:
        """Wait until every message handed over is either queued or refused (call after the joiner closed)."""
        if self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)

    async def _hand_over(self, update: dict[str, Any]) -> None:
        update_id: int = update["update_id"]
        attempt = 0
        while True:
            attempt += 1
            try:
                queued = await self._intake(update)
                break
            except Exception as exc:
                if is_storage_error(exc):  # pairing.json on a full disk, say: wait, drop nothing
                    self._outage.failed(exc)
                    await asyncio.sleep(self._outage.delay(attempt))
                    continue
                log.exception("telegram_update_failed", update_id=update_id, attempt=attempt)
                if attempt >= self._max_attempts:
                    log.error("telegram_update_dropped", update_id=update_id, attempts=attempt)
                    await self._journal.release([update_id])
                    return
        if queued is None:
            await self._journal.release([update_id])
            return
        task = asyncio.create_task(self._release_when_queued(update_id, queued))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release_when_queued(self, update_id: int, queued: asyncio.Future[None]) -> None:
        try:
            await queued
        except NotTaken:
            return  # the channel stopped first (storage still refusing, say): held for the next start
        except Exception as exc:  # given up after the joiner's tries
            log.error("telegram_update_dropped", update_id=update_id, error=f"{type(exc).__name__}: {exc}")
        await self._journal.release([update_id])
