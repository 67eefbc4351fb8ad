"""A turn's memory writes, fsynced a moment later instead of on the reply path of every message.

A turn's daily-note line and items are made from messages the session log already holds durably, so
they need not hold up the reply with fsyncs of their own: they are written at once (a kill loses
nothing, written data is in the kernel's page cache) and fsynced together within ``delay`` seconds,
before messages leave a session (see :meth:`MemoryService.archive_messages`) and at close. Only a power
cut or a kernel crash inside that window can lose them, and then the next start makes them again.

The delay is minutes, not a second: at a human pace (a message every few seconds) a one-second delay
synced every turn on its own, two more fsyncs per message. A longer one loses nothing more, since the
next start makes lost writes again either way; it only lets the next start look a little further back.
The kernel writes dirty pages back within ~30 s by itself, so a power cut rarely finds that much:

- before the first unsynced write of a run, a marker (``memory/.unsynced``) is put durably in place,
  holding the time since which writes may be missing; it stays until the run closes cleanly;
- after each flush that left nothing unsynced, the marker's time moves to when the flush began, without
  an fsync: the time on disk is never later than the oldest write a power cut can lose (an older one,
  or a torn one, only makes the next start look further back);
- a write made while the clock reads earlier than the marker (stepped back by NTP, say) first puts
  that earlier time durably in place: the sessions saved meanwhile carry that clock's dates too, and a
  start would not look back far enough to find them;
- a start that finds the marker records again what the sessions changed since its time hold and
  memory lacks (:meth:`MemoryService.recover`, driven by ``bot/startup.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import structlog

from bot.domain import parse_time, utcnow
from bot.storage import FILE_MODE, atomic_write_text

log = structlog.get_logger(__name__)

MARKER = ".unsynced"
DELAY_SECONDS = 300.0  # see the module doc: what it costs is a longer look back after a power cut


class LazySync:
    """Tracks writes made without an fsync and syncs them (``flush``) a moment later; see the module doc."""

    def __init__(
        self,
        marker: Path,
        flush: Callable[[], Awaitable[None]],
        *,
        delay: float = DELAY_SECONDS,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        """``clock`` must be the one the file system dates files by: a start compares the marker's
        time with the sessions' modification times."""
        self._marker = marker
        self._flush = flush
        self._delay = delay
        self._clock = clock
        self._placed = False  # the marker is on disk for this run (or left by the last one)
        self._since: datetime | None = None  # the time the marker holds (or a later one)
        self._inherited = False  # the last run left it: only :meth:`recovered` lets it go
        self._dirty = False  # written since the last flush began
        self._writing = 0  # unsynced writes under way
        self._mark_lock = asyncio.Lock()
        self._sync_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    @property
    def pending(self) -> bool:
        """Whether something written may not be on disk yet."""
        return self._dirty or self._writing > 0

    def left_by_last_run(self) -> datetime | None:
        """The marker's time, if the last run did not close cleanly (blocking; call at start)."""
        try:
            raw = self._marker.read_bytes()
        except FileNotFoundError:
            return None
        self._placed = self._inherited = True
        try:
            self._since = parse_time(raw.decode("utf-8").strip())
        except ValueError:  # torn or damaged (not even UTF-8), by the same power cut: every session
            self._since = datetime.fromtimestamp(0, UTC)
        return self._since

    @contextlib.asynccontextmanager
    async def writing(self) -> AsyncIterator[None]:
        """Around writes made without an fsync: the marker first, a sync scheduled after."""
        self._writing += 1
        try:
            if self._needs_mark():
                async with self._mark_lock:
                    if self._needs_mark():
                        now = self._clock()
                        await asyncio.to_thread(atomic_write_text, self._marker, now.isoformat())
                        self._placed, self._since = True, now
            yield
        finally:
            self._writing -= 1
            self._dirty = True
            if self._task is None or self._task.done():
                self._task = asyncio.create_task(self._later(), name="memory-sync")

    async def sync(self) -> None:
        """fsync what was written so far; then move the marker's time up (see the module doc)."""
        async with self._sync_lock:
            if not self.pending:
                return
            began, self._dirty = self._clock(), False
            try:
                await self._flush()
            except BaseException:
                self._dirty = True  # not synced: the next sync (or close) tries again
                raise
            if not self.pending and not self._inherited:
                await asyncio.to_thread(_restamp, self._marker, began)
                self._since = began

    def _needs_mark(self) -> bool:
        """No marker yet, or the clock reads earlier than the one in place."""
        return not self._placed or (self._since is not None and self._clock() < self._since)

    async def keep(self, since: datetime) -> None:
        """Writes made since ``since`` failed for good this run (a full disk): the marker stays at close
        and holds no later time, so the next start records them again."""
        async with self._mark_lock:
            self._inherited = True  # (like a last run's: only :meth:`recovered` lets it go)
            if self._placed and self._since is not None and self._since <= since:
                return
            try:
                await asyncio.to_thread(atomic_write_text, self._marker, since.isoformat())
            except OSError as exc:
                log.error("memory_marker_unwritable", path=str(self._marker), error=repr(exc))
                return
            self._placed, self._since = True, since

    async def recovered(self) -> None:
        """What the last run may have lost was made again: its marker can go (called before any write)."""
        async with self._sync_lock:
            self._inherited = False
            if not self.pending:
                await asyncio.to_thread(_remove, self._marker)
                self._placed = False

    async def close(self) -> None:
        """Sync, and let the marker go: a clean stop leaves nothing to look for."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.sync()
        if self._placed and not self._inherited and not self.pending:
            await asyncio.to_thread(_remove, self._marker)
            self._placed = False

    async def _later(self) -> None:
        while self.pending:
            await asyncio.sleep(self._delay)
            try:
                await self.sync()
            except OSError as exc:  # the marker stays: the next start records what may be missing
                log.error("memory_sync_failed", error=repr(exc))
                return


def _restamp(path: Path, when: datetime) -> None:
    """Overwrite the marker's time in place, without an fsync (see the module doc)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.write(fd, when.isoformat().encode("ascii"))
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
