"""Waiting for the model: a chat whose answer failed because the model was out of reach tries again later.

The LLM client already retries a failed call a few times and tries the fallback models, within seconds.
An outage of the provider (5xx, connection refused), a rate limit or a model that answers too slowly
can last longer than that. Telling the user "send another message to try again" then leaves the
question unanswered unless the user notices; a bot that never forgets answers it once it can. So such
a turn is not answered: its messages stay in the session and pending in the inbox (a restart still
answers them, once), the chat is told once that the answer will come, and its lane tries the turn again
by itself (bot/dispatcher.py) with growing pauses, for a bounded time. Other failures (a refused key,
a prompt too long for the model, an answer we cannot use, a bug) would fail again the same way: the
chat is told at once, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from bot.errors import LLMError, LLMRateLimited, LLMTimeout, LLMUnavailable
from bot.retry import Backoff
from pipeline import SystemFailure, Turn

TRANSIENT: tuple[type[LLMError], ...] = (LLMUnavailable, LLMRateLimited, LLMTimeout)

NOTICE = (
    "⏳ I can't reach the AI model right now. Your message is saved, and I'll answer it as soon as the "
    "model is back — no need to send it again."
)


def waits_for_model(turn: Turn) -> bool:
    """Whether ``turn`` ended without an answer because the model was out of reach for now (the model
    failure ``_reply_text`` would report is one of :data:`TRANSIENT`)."""
    if turn.stopped or (turn.reply and turn.reply.strip()):
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

    async def until_next_try(self) -> None:
        """Returns when the next try is due, or at once after :meth:`wake`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.next_try_in()):
                await self._wake.wait()
