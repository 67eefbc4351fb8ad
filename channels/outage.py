"""Storage outages as a channel sees them: retried with bounded backoff, logged once each.

A full disk or a broken folder makes every write fail, and a channel retries what it could not store
(it never confirms it to the platform meanwhile). Logging every retry would flood the log for the
length of the outage, so :class:`StorageOutage` logs an error when an outage starts (with what to do)
and one line when it ends (how long it lasted, how many tries failed); the retries in between log at
debug level. The delay before the n-th retry doubles from ``first_delay`` up to ``max_delay``.

    outage = StorageOutage("the Telegram update journal")
    await retry(
        write,
        retry_if=lambda exc, tries: is_storage_error(exc),
        wait=lambda exc, tries: outage.delay(tries),
        on_retry=lambda exc, tries, delay: outage.failed(exc),
        sleep=outage.pause,
    )
    outage.recovered()

A write that goes through during the outage ends the pauses of the others (:meth:`StorageOutage.pause`):
storage is back, and a pause left to run out (up to ``max_delay``) would hold their messages for nothing.

Several writers may share one outage (the Telegram intake's lanes and its paste joiner): each names
itself (``holder``), and the outage ends when the last one failing goes through, so one chat's write
that works does not clear /healthz while another's is still refused. A writer that stops retrying
(its message given up after failing for another reason, or cancelled) says so (:meth:`given_up`):
once no writer's write waits for storage, /healthz no longer names it, for it tells what holds a
channel now, and nothing does; the next write that storage refuses names it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from bot.errors import StorageError
from bot.ports import ChannelHealth
from bot.retry import Backoff

log = structlog.get_logger(__name__)

_KEEPS = "membot keeps retrying and confirms nothing to the chat platform that it has not stored"
_HINT = f"free disk space or fix the workspace's permissions; {_KEEPS}"
# A StorageError no OSError caused is about a file's content (pairing.json damaged, or a newer membot's):
# its message names the file and the fix, which disk space or permissions would not be.
_MEND = f"mend the file as the error says; {_KEEPS}"


def is_storage_error(exc: BaseException) -> bool:
    """A write that may work later (disk full, read-only or missing folder), not a bug in the data."""
    return isinstance(exc, OSError | StorageError)


class StorageOutage:
    """Tracks one kind of storage write (``what``) through failures; see the module doc.

    ``health``: the channel's, for a write without which it takes no message in: while the outage
    lasts it is listed in ``storage_errors`` (so /healthz answers 503, as for a platform out of reach).
    ``hint``: what the operator reads beside the error when the outage starts; by default, by the error:
    the disk's fix for a refused read or write, "as the error says" for a file whose error names its fix
    (a caller whose outage is only ever such a file may say what waits instead).
    """

    def __init__(
        self,
        what: str,
        *,
        first_delay: float = 0.5,
        max_delay: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        health: ChannelHealth | None = None,
        hint: str | None = None,
    ) -> None:
        self.what = what
        self._hint = hint
        self._first = first_delay
        self._max = max_delay
        self._clock = clock
        self._health = health
        self._since: float | None = None
        self._failures = 0
        self._failing: set[object] = set()  # the holders whose last write failed
        self._back = asyncio.Event()  # set, then replaced, when a write goes through during the outage

    @property
    def active(self) -> bool:
        return self._since is not None

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1, 2, ...): doubling, at most ``max_delay``."""
        return Backoff(self._first, self._max)(attempt - 1)

    async def pause(self, delay: float) -> None:
        """Wait ``delay`` seconds before trying again, or until a write of this kind goes through (then
        storage is back: waiting out the pause would hold the message for nothing)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._back.wait()

    def wake(self) -> None:
        """End the pauses under way now (a write went through, or their writer is stopping)."""
        self._back.set()
        self._back = asyncio.Event()

    def failed(self, exc: BaseException, holder: object = None) -> None:
        self._failures += 1
        self._failing.add(holder)
        if self._health is not None:
            where = getattr(exc, "filename", None)
            self._health.storage_errors[self.what] = _describe(exc) + (f" ({where})" if where else "")
        if self._since is not None:
            log.debug("storage_still_unavailable", what=self.what, error=_describe(exc))
            return
        self._since = self._clock()
        log.error(
            "storage_unavailable",
            what=self.what,
            error=_describe(exc),
            path=getattr(exc, "filename", None),
            hint=self._hint or _hint(exc),
        )

    def recovered(self, holder: object = None) -> None:
        """``holder``'s write went through; the outage ends once no holder's is failing. The writes
        that wait meanwhile (:meth:`pause`) try again at once."""
        if self._since is not None:
            self.wake()
        self._failing.discard(holder)
        if self._failing:
            return
        if self._health is not None:
            self._health.storage_errors.pop(self.what, None)
        if self._since is None:
            return
        seconds = round(self._clock() - self._since, 3)
        log.info("storage_recovered", what=self.what, seconds=seconds, failed_tries=self._failures)
        self._since = None
        self._failures = 0

    def given_up(self, holder: object = None) -> None:
        """``holder`` stopped retrying (cancelled, or its write given up after another failure): it keeps
        the outage no longer. Once no holder's write is failing, nothing waits for storage, and the
        channel's health no longer names it; the outage as logged lasts until a write goes through
        (whether storage works again is known then), and a refused one names it again at once."""
        if holder not in self._failing:
            return
        self._failing.discard(holder)
        if not self._failing and self._health is not None:
            self._health.storage_errors.pop(self.what, None)


def _hint(exc: BaseException) -> str:
    return _MEND if isinstance(exc, StorageError) and not isinstance(exc.__cause__, OSError) else _HINT


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    return f"{type(exc).__name__}: {exc}"
