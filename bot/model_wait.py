"""Waiting for the model: a chat whose answer failed because the model was out of reach tries again later.

The LLM client already retries a failed call a few times and tries the fallback models, within seconds.
An outage of the provider (5xx, connection refused), a rate limit or a model that answers too slowly
can last longer than that. Telling the user "send another message to try again" then leaves the
question unanswered unless the user notices; a bot that never forgets answers it once it can. So such
a turn is not answered: its messages stay in the session and pending in the inbox (a restart still
answers them, once), the chat is told once that the answer will come, and its lane tries the turn again
by itself (bot/dispatcher/turns.py) with growing pauses, for a bounded time. Other failures (a refused key,
a prompt too long for the model, an answer we cannot use, a bug) would fail again the same way: the
chat is told at once, as before.

A restart does not start a wait over: :class:`WaitRecords` keeps, per waiting chat, since when it waits
and which inbox entries it was told about (``state/model_wait.json``, the bot's own state), so the next
start goes on with the same wait: no second notice for the same messages, and the same max age.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from bot import damaged
from bot.domain import parse_time, utcnow
from bot.errors import LLMError, LLMRateLimited, LLMTimeout, LLMUnavailable, StorageError
from bot.retry import Backoff
from bot.storage import atomic_write_text
from pipeline import SystemFailure, Turn

log = structlog.get_logger(__name__)

WAIT_FILE = "model_wait.json"  # in the workspace's state/ folder (see WaitRecords)

TRANSIENT: tuple[type[LLMError], ...] = (LLMUnavailable, LLMRateLimited, LLMTimeout)

NOTICE = (
    "⏳ I can't reach the AI model right now. Your message is saved, and I'll answer it as soon as the "
    "model is back — no need to send it again."
)


def waits_for_model(turn: Turn) -> bool:
    """Whether ``turn`` ended without an answer because the model was out of reach for now (the model
    failure ``bot.dispatcher.replies.reply_text`` would report is one of :data:`TRANSIENT`)."""
    if turn.stopped or turn.answered:
        return False
    failure = model_failure(turn)
    return failure is not None and issubclass(failure.kind, TRANSIENT)


def model_failure(turn: Turn) -> SystemFailure | None:
    """The turn's first failure of the model itself: the one the chat is told about."""
    return next((f for f in turn.failures if issubclass(f.kind, LLMError)), None)


@dataclass(slots=True)
class ModelWait:
    """One chat's wait for the model: since when, how many tries failed, when the next one is.

    The lane's worker sleeps in :meth:`until_next_try` outside the lane's lock (commands are answered
    meanwhile); :meth:`wake` cuts the pause short, for a message that joins the waiting ones, a /stop or
    a shutdown.
    """

    since: float = field(default_factory=time.monotonic)
    attempts: int = 0  # tries that failed so far
    next_at: float = 0.0  # time.monotonic() of the next try
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    def schedule(self, backoff: Backoff, max_age: float, *, hint: float | None = None) -> float | None:
        """Count a failed try and set the next one; returns the pause before it in seconds, or ``None``
        once the chat has waited ``max_age`` seconds (the turn then fails as any other). The last try
        falls at ``max_age``, not after it.

        ``hint`` is the provider's Retry-After: a try before it would only be refused again (and count
        against a rate limit), so the pause is at least that long, even past the backoff's cap."""
        now = time.monotonic()
        left = self.since + max_age - now
        if left <= 0:
            return None
        pause = min(max(backoff(self.attempts), hint or 0.0), left)
        self.attempts += 1
        self.next_at = now + pause
        self._wake.clear()  # only what arrives during the pause brings the next try forward
        return pause

    def next_try_in(self) -> float:
        return max(0.0, self.next_at - time.monotonic())

    def wake(self) -> None:
        self._wake.set()

    @property
    def woken(self) -> bool:
        """:meth:`wake` was called since the last failed try: the next try is due now."""
        return self._wake.is_set()

    async def until_next_try(self) -> None:
        """Returns when the next try is due, or at once after :meth:`wake`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.next_try_in()):
                await self._wake.wait()


@dataclass(frozen=True, slots=True)
class WaitRecord:
    """A chat's wait as a restart finds it: since when (wall clock) and the entries it was told about."""

    since: datetime
    entries: frozenset[str]

    def resumed(self) -> ModelWait:
        """The wait as this process goes on with it: same age, told already, next try at once."""
        waited = max(0.0, (utcnow() - self.since).total_seconds())
        return ModelWait(since=time.monotonic() - waited)


class WaitRecords:
    """The chats waiting for the model, on disk (see the module doc). ``load`` once at start-up.

    The whole file is rewritten atomically at each change (a wait begins or ends: rare), one write at a
    time. A write that fails is logged and costs only what the file is for: a second notice after a restart.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._records: dict[str, WaitRecord] = {}
        self._lock = asyncio.Lock()

    async def load(self) -> dict[str, WaitRecord]:
        self._records = await asyncio.to_thread(_read, self._path)
        return dict(self._records)

    async def begin(self, sid: str, entries: Collection[str]) -> None:
        """``sid`` waits from now on, and was told about ``entries``."""
        self._records[sid] = WaitRecord(utcnow(), frozenset(entries))
        await self._write()

    async def end(self, sid: str) -> None:
        if self._records.pop(sid, None) is not None:
            await self._write()

    async def _write(self) -> None:
        async with self._lock:  # the snapshot is taken inside: the last write holds the newest state
            data = _dump(self._records)
            try:
                await asyncio.to_thread(atomic_write_text, self._path, data)
            except (StorageError, OSError) as exc:
                log.error("model_wait_state_not_saved", path=str(self._path), error=str(exc))


def move_record(path: Path, old: str, new: str) -> bool:
    """Chat ``old``'s wait on disk made ``new``'s, for a chat whose id changed (bot/session_moves.py, at
    the start, before :meth:`WaitRecords.load`; blocking). Left under the old id, the start ended it as
    answered and the moved messages' first failed try began a new wait: a second notice for the same
    messages, and ``model_retry_max_age`` counted again. False when ``new`` waits too (both are left:
    the new chat's goes on, the old one's ends at the start). Safe to repeat: a done move finds no ``old``."""
    records = _read(path)
    if old not in records:
        return True
    if new in records:
        return False
    records[new] = records.pop(old)
    atomic_write_text(path, _dump(records))
    return True


def _dump(records: dict[str, WaitRecord]) -> str:
    data = {sid: {"since": r.since.isoformat(), "entries": sorted(r.entries)} for sid, r in records.items()}
    return json.dumps(data) + "\n"


def _read(path: Path) -> dict[str, WaitRecord]:
    """The records on disk; a damaged file is moved aside (kept for the operator) and logged."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.error("model_wait_state_unreadable", path=str(path), error=exc.strerror or str(exc))
        return {}
    try:
        data: Any = json.loads(raw.decode("utf-8"))
        return {
            str(sid): WaitRecord(parse_time(r["since"]), frozenset(str(e) for e in r["entries"]))
            for sid, r in data.items()
        }
    except damaged.UNREADABLE:  # (Infinity where an id belongs: OverflowError)
        damaged.move_aside(path, raw, event="model_wait_state_damaged")
        return {}
