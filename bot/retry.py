"""One retry policy for membot: exponential backoff (capped, optional jitter and server hint) and a loop.

:class:`Backoff` says how long to wait before retry number ``n``; :func:`retry` runs a call until it
succeeds or ``retry_if`` says another try cannot help, sleeping ``wait`` seconds in between::

    backoff = Backoff(first=0.5, cap=20.0, jitter=random.random)
    reply = await retry(
        send,
        retry_if=lambda exc, tries: is_transient(exc) and tries <= 3,  # tries so far, counting from 1
        wait=lambda exc, tries: backoff(tries - 1, hint=getattr(exc, "retry_after", None)),
        on_retry=lambda exc, tries, delay: log.info("retry", tries=tries, delay=delay),
    )

Only ``Exception``s are considered (cancellation and ``KeyboardInterrupt`` always propagate), and the
error that ends the loop is raised as it is, never wrapped. ``sleep`` is injectable so tests can check
the delays without waiting for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays that double from ``first`` and never exceed ``cap``.

    ``jitter``, when given, returns a float in [0, 1) and scales each delay by ``0.5 + jitter()``
    (so it varies between half and one and a half times the plain value) before the cap applies.
    A server's ``hint`` (retry-after) replaces the computed delay, still capped.
    """

    first: float
    cap: float
    jitter: Callable[[], float] | None = None

    def __call__(self, retry: int, *, hint: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first retry)."""
        if hint is not None:
            return min(hint, self.cap)
        delay = self.first * 2 ** max(0, retry)
        if self.jitter is not None:
            delay *= 0.5 + self.jitter()
        return float(min(delay, self.cap))


async def retry(
    call: Callable[[], Awaitable[T]],
    *,
    retry_if: Callable[[Exception, int], bool],
    wait: Callable[[Exception, int], float],
    on_retry: Callable[[Exception, int, float], object] | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> T:
    """Await ``call()`` until it returns; after each failure decide whether to try again.

    ``retry_if(exc, tries)`` and ``wait(exc, tries)`` get the error and the number of tries made so
    far (1 after the first failure). When ``retry_if`` is false the error is raised as is; else
    ``on_retry(exc, tries, delay)`` is told and the loop sleeps ``delay`` seconds before the next try
    (``sleep``, default ``asyncio.sleep`` looked up at each call).
    """
    tries = 0
    while True:
        tries += 1
        try:
            return await call()
        except Exception as exc:
            if not retry_if(exc, tries):
                raise
            delay = wait(exc, tries)
            if on_retry is not None:
                on_retry(exc, tries, delay)
        await (sleep or asyncio.sleep)(delay)
