"""Handing held Telegram updates over to the dispatcher: each chat's in arrival order, chats side by side.

The update journal (:mod:`channels.telegram.journal`) holds every accepted update until the dispatcher
has it. :class:`HandOver` takes the held updates out in arrival order and puts each in its chat's lane
(:mod:`channels.telegram.lanes`, :func:`lane_of`), where the channel's intake runs on it (access checks,
media, the paste joiner). A chat's updates are taken in one at a time, in order: its second message never
overtakes its first (the paste joiner and the dispatcher rely on that). Other chats go on meanwhile, up
to ``width`` chats at once, so a photo Telegram's file server sends slowly (for up to
``telegram.download_timeout``) holds back only the chat that sent it. An update is released from the
journal once its message is queued, or at once when it needed nothing. Failures are sorted by kind,
because a full disk and a bug need opposite treatment:

- storage (``OSError``, ``StorageError``): wait with backoff and try again, for as long as it takes;
  the outage is logged once, and /healthz names it until no chat's intake waits for storage any more.
  Dropping would lose the message, and a restart could not do better. The chat's later updates wait
  behind it; other chats do not: the chat gives its worker back while it waits (a pairing.json only
  the operator can fix keeps every stranger's chat waiting, and 8 of them stopped the bot).
- anything else: tried ``max_attempts`` times, then the update is logged and released, so one message
  that cannot be processed does not block its chat's later ones.

When the channel stops, what was not handed over (not yet taken in, waiting in its lane, or not taken by
``submit`` before the joiner closed) stays held and is taken in at the next start.

The updates held from an earlier run come first: no update that arrived after the start is taken in
before they all are (they go side by side among themselves, but a slow download among them holds back
every chat's new messages at that start). Then ``resumed_done`` is called: the channel hands on the
paste they make at once, so a message that arrives after the start is never joined to them. The
dispatcher may have them already (a kill between its inbox's fsync and the journal's release) and knows
a joined message by its first update's message id: a new message joined in would be dropped with the
redelivery. One that waits for storage counts as taken in here (a pairing.json only the operator can
fix kept every chat's new messages out after a restart, for as long as it stayed so); its chat's new
messages wait behind it in its lane, and once it is taken in, ``resumed_done`` is called again, so it
is handed on by itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from channels.outage import StorageOutage, is_storage_error
from channels.telegram.inbound import NotTaken
from channels.telegram.journal import UpdateJournal
from channels.telegram.lanes import Lanes

log = structlog.get_logger(__name__)

Intake = Callable[[dict[str, Any]], Awaitable["asyncio.Future[None] | None"]]
"""Takes one update in; returns a future that completes once its message is queued, or ``None`` when
there is nothing to queue."""

WIDTH = 8  # chats taken in at once; the others wait their turn (a flood spawns no tasks)

LaneKey = tuple[str, int]
"""``("chat", chat id)``, or ``("update", update id)`` for an update about no chat."""


def lane_of(update: Mapping[str, Any]) -> LaneKey:
    """The lane of an update: its chat's, whatever kind of update it is (a message, an edit, a member
    change, a button pressed under a message); an update about no chat gets a lane of its own."""
    for value in update.values():
        if not isinstance(value, dict):
            continue
        for holder in (value, value.get("message")):  # a callback query names its chat in its message
            chat = holder.get("chat") if isinstance(holder, dict) else None
            if isinstance(chat, dict) and isinstance(chat.get("id"), int):
                return ("chat", chat["id"])
    return ("update", update["update_id"])


class HandOver:
    """Runs until cancelled (:meth:`run`); :meth:`drain` waits for the releases still pending.

    ``width`` bounds how many chats are taken in at once (see the module doc).
    """

    def __init__(
        self,
        journal: UpdateJournal,
        intake: Intake,
        *,
        outage: StorageOutage,
        max_attempts: int,
        resumed: int = 0,
        resumed_done: Callable[[], None] = lambda: None,
        width: int = WIDTH,
    ) -> None:
        self._resumed = resumed  # held updates of an earlier run: taken in before any other
        self._resumed_done = resumed_done
        self._journal = journal
        self._intake = intake
        self._outage = outage
        self._max_attempts = max_attempts
        self._width = width
        self._releases: set[asyncio.Task[None]] = set()
        self._attempts: dict[int, int] = {}  # update id -> tries so far, of the updates waiting for storage
        self._untried: set[int] = set()  # updates of an earlier run not tried yet
        self._tried = asyncio.Event()  # set once none is left
        self._late: set[int] = set()  # updates of an earlier run not taken in yet
        self._cut = False  # resumed_done was called

    async def run(self) -> None:
        lanes: Lanes[LaneKey, dict[str, Any]] = Lanes(
            self._hand_over, width=self._width, pause=self._outage.pause
        )
        try:
            await self._run(lanes)
        finally:  # stopped: the updates waiting for storage stay held, and hold the outage no longer
            for update_id in self._attempts:
                self._outage.given_up(holder=update_id)
            self._attempts.clear()

    async def _run(self, lanes: Lanes[LaneKey, dict[str, Any]]) -> None:
        async with asyncio.TaskGroup() as group:  # cancelling run() cancels the lanes: the rest stays held
            group.create_task(lanes.run(), name="telegram-handover-lanes")
            if self._resumed > 0:
                resumed = [dict(await self._journal.next()) for _ in range(self._resumed)]
                self._untried = {update["update_id"] for update in resumed}
                self._late = set(self._untried)
                for update in resumed:
                    lanes.put(lane_of(update), update)
                # All taken in (or waiting for storage); only then the updates that arrived after the start
                await self._tried.wait()
                self._resumed_done()
                self._cut = True
            while True:
                update = dict(await self._journal.next())
                lanes.put(lane_of(update), update)

    async def drain(self) -> None:
        """Wait until every message handed over is either queued or refused (call after the joiner closed)."""
        if self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)

    async def _hand_over(self, update: dict[str, Any]) -> float | None:
        """Take ``update`` in; the seconds to wait before it is tried again when storage refused it (its
        lane waits, the worker takes other chats meanwhile), else None."""
        update_id: int = update["update_id"]
        attempt = self._attempts.pop(update_id, 0)
        waits = False
        try:
            while True:
                attempt += 1
                try:
                    queued = await self._intake(update)
                except Exception as exc:
                    if is_storage_error(exc):  # pairing.json on a full disk, say: wait, drop nothing
                        self._outage.failed(exc, holder=update_id)
                        self._attempts[update_id] = attempt
                        waits = True
                        return self._outage.delay(attempt)
                    log.exception("telegram_update_failed", update_id=update_id, attempt=attempt)
                    if attempt >= self._max_attempts:
                        log.error("telegram_update_dropped", update_id=update_id, attempts=attempt)
                        await self._journal.release([update_id])
                        return None
                else:
                    self._outage.recovered(holder=update_id)  # ends unless another chat's write still fails
                    break
        finally:
            if not waits:  # dropped or cancelled: it holds the outage no longer
                self._outage.given_up(holder=update_id)
            self._untried.discard(update_id)
            if not self._untried:
                self._tried.set()
        if update_id in self._late:
            self._late.discard(update_id)
            if self._cut:  # taken in after the start's cut: handed on by itself (see the module doc)
                self._resumed_done()
        if queued is None:
            await self._journal.release([update_id])
            return None
        task = asyncio.create_task(self._release_when_queued(update_id, queued))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)
        return None

    async def _release_when_queued(self, update_id: int, queued: asyncio.Future[None]) -> None:
        try:
            await queued
        except NotTaken:
            return  # the channel stopped first (storage still refusing, say): held for the next start
        except Exception as exc:  # given up after the joiner's tries
            log.error("telegram_update_dropped", update_id=update_id, error=f"{type(exc).__name__}: {exc}")
        await self._journal.release([update_id])
