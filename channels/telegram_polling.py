"""Long polling that confirms a Telegram update only once membot has it safely queued.

``getUpdates(offset=N)`` tells Telegram that every update below ``N`` was handled, and Telegram then
forgets them. PTB's ``Updater`` moves the offset on as soon as it has *fetched* a batch, so a crash or
kill between fetching and queuing loses those messages. :class:`UpdatePoller` moves the offset only
past updates whose hand-over finished (for messages: ``Dispatcher.submit`` returned, so they are in the
durable inbox). An update still in its paste-join window holds the offset back; meanwhile the poller
asks for newer updates with short polls and skips the ones it already has, so joining still works.
After a crash Telegram sends the unconfirmed updates again: at least once, never lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

import structlog
from telegram import Update
from telegram.error import InvalidToken, RetryAfter, TelegramError

log = structlog.get_logger(__name__)


Fetch = Callable[[int | None, int], Awaitable[Sequence[Update]]]
"""``(offset, timeout seconds)`` → the updates from ``offset`` on (``Bot.get_updates``)."""

Handle = Callable[[Update], Awaitable["asyncio.Future[None] | None"]]
"""Takes an update in; returns a future that completes once it is queued, or ``None`` if there is
nothing to queue (ignored, or already queued)."""


class UpdatePoller:
    """Runs ``getUpdates`` until cancelled; :meth:`confirm` on shutdown tells Telegram what was kept.

    Args:
        fetch: one ``getUpdates`` call.
        handle: takes one update in (see :data:`Handle`).
        timeout: long-poll timeout in seconds.
        on_error: told about each failed poll (health, logs); polling goes on with backoff.
        recheck: how often to look for newer updates while an earlier one is still being handed over.
        max_attempts: hand-overs of one update that may fail before it is dropped (and logged).
        max_backoff: the longest pause after failed polls.
    """

    def __init__(
        self,
        fetch: Fetch,
        handle: Handle,
        *,
        timeout: int,
        on_error: Callable[[TelegramError], None],
        recheck: float = 0.25,
        max_attempts: int = 3,
        max_backoff: float = 30.0,
    ) -> None:
        self._fetch = fetch
        self._handle = handle
        self._timeout = timeout
        self._on_error = on_error
        self._recheck = recheck
        self._max_attempts = max_attempts
        self._max_backoff = max_backoff
        self._taken: dict[int, asyncio.Future[None] | None] = {}  # update id -> its hand-over
        self._attempts: dict[int, int] = {}
        self._next: int | None = None  # one past the newest update taken

    @property
    def offset(self) -> int | None:
        """The offset that confirms exactly the updates handed over: the oldest unfinished one."""
        for update_id in sorted(self._taken):
            if _state(self._taken[update_id]) != "ok":
                return update_id
        return self._next

    async def run(self) -> None:
        errors = 0
        while True:
            states = {update_id: _state(done) for update_id, done in self._taken.items()}
            unfinished = [self._taken[u] for u, state in states.items() if state == "pending"]
            if unfinished:  # an earlier update is still on its way: look for newer ones, don't confirm
                await asyncio.wait([f for f in unfinished if f is not None], timeout=self._recheck)
            elif "failed" in states.values():
                await asyncio.sleep(self._recheck * 4)  # a short pause before taking it again
            self._forget_confirmed()
            holding = self.offset != self._next
            try:
                updates = await self._fetch(self.offset, 0 if holding else self._timeout)
            except InvalidToken:
                log.error("telegram_polling_stopped", reason="the bot token was revoked")
                raise
            except TelegramError as exc:
                self._on_error(exc)
                errors += 1
                await asyncio.sleep(_pause(exc, errors, self._max_backoff))
                continue
            errors = 0
            for update in updates:
                await self._take(update)

    async def confirm(self) -> None:
        """Tell Telegram which updates were handed over, so the next start does not see them again."""
        if self._next is None:
            return
        try:
            await self._fetch(self.offset, 0)
        except TelegramError as exc:
            log.warning("telegram_confirm_failed", error=str(exc))

    async def _take(self, update: Update) -> None:
        update_id = update.update_id
        if update_id in self._taken and _state(self._taken[update_id]) != "failed":
            return  # fetched again while an earlier update held the offset back
        attempts = self._attempts[update_id] = self._attempts.get(update_id, 0) + 1
        if attempts > self._max_attempts:
            log.error("telegram_update_dropped", update_id=update_id, attempts=attempts - 1)
            self._taken[update_id] = None
            return
        try:
            self._taken[update_id] = await self._handle(update)
        except Exception:
            log.exception("telegram_update_failed", update_id=update_id, attempt=attempts)
            failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            failed.set_exception(RuntimeError("hand-over failed"))
            failed.exception()  # retrieved: no "exception never retrieved" warning
            self._taken[update_id] = failed
        if self._next is None or update_id >= self._next:
            self._next = update_id + 1

    def _forget_confirmed(self) -> None:
        offset = self.offset
        if offset is None:
            return
        for update_id in [u for u in self._taken if u < offset]:
            del self._taken[update_id]
            self._attempts.pop(update_id, None)


def _state(done: asyncio.Future[None] | None) -> str:
    """``ok`` (queued, or nothing to queue), ``pending`` or ``failed``."""
    if done is None:
        return "ok"
    if not done.done():
        return "pending"
    return "failed" if done.cancelled() or done.exception() is not None else "ok"


def _pause(exc: TelegramError, errors: int, cap: float) -> float:
    if isinstance(exc, RetryAfter):
        after = exc.retry_after
        return after.total_seconds() if isinstance(after, timedelta) else float(after)
    return float(min(cap, 2 ** (errors - 1)))
