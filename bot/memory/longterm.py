"""MEMORY.md: long-term facts the operator owns, read fresh on change and written by compare-and-swap.

Operators edit the file with any editor while the bot runs. Every read returns the text and its content
hash. A bot write is a change applied to the newest text: under an advisory lock shared with
``membot memory edit``, the file is read again, the change applied, and the result swapped in by
:class:`~bot.memory.swap.FileSwapper`, which hands back any version an editor saved in the meantime (or
wrote into the old file after the swap) so the change is merged into it and nothing the operator saved
is overwritten. :func:`~bot.memory.text_merge.merge_lines` re-applies the bot's change on top of the
operator's version. Why a write is refused (:class:`MemoryFull`, ...): longterm_errors.py.

Each bot write first appends the lines it removes to ``MEMORY.replaced.md`` beside it (replaced.py), so
a consolidation that drops a fact it should have kept can be undone. A bot write that would grow
MEMORY.md past ``memory.max_memory_hard_size`` is refused (:class:`MemoryFull`); the operator's edits are
never limited, but a file past the limit is logged when read (``memory_file_over_limit``): the prompt
shows only its start. A file more than :data:`READ_MARGIN` past the limit is not even read whole (a
multi-GB one took the process down): the bot reads its start (longterm_read.py), logs
``memory_file_too_large`` and refuses its own writes, never cutting the file. The merge of late edits
reads no more (nor any version it merges, see late_edits.py): while the file is that large, an edit to
merge waits for it to be shortened (``memory_late_edit_waiting``), and no write, not even
``membot memory edit``'s, makes it that large.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import structlog

from bot.config import MemorySettings
from bot.memory import strays
from bot.memory.longterm_errors import Conflict, MemoryFull, NotUtf8, ReadOnly, read_only_refused
from bot.memory.longterm_read import Snapshot, SnapshotCache, content_hash
from bot.memory.replaced import DEFAULT_REPLACED_MAX_BYTES, REPLACED_NAME, ReplacedLines
from bot.memory.swap import FileSwapper
from bot.memory.text_merge import in_style_of, merge_lines
from bot.memory.versions import TooLarge, Version

log = structlog.get_logger(__name__)

MAX_CAS_SECONDS = 5.0
DEFAULT_MAX_BYTES = 65_536
READ_MARGIN = 1 << 20  # how far past its limit an operator's MEMORY.md is still read whole (and written)
_SETTLE_PAUSE = 0.005


@dataclass(frozen=True, slots=True)
class Limits:
    """How large the bot may make MEMORY.md, and when MEMORY.replaced.md rotates (bytes)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    replaced_max_bytes: int = DEFAULT_REPLACED_MAX_BYTES

    @classmethod
    def of(cls, settings: MemorySettings) -> Limits:
        return cls(settings.max_memory_hard_size, settings.replaced_max_size)


Change = Callable[[str], str]
T = TypeVar("T")


class LongTermMemory:
    """MEMORY.md with an mtime-checked cache and compare-and-swap writes.

    Usage::

        snap = await memory.read()
        await memory.write(new_text, expected=snap.hash)   # raises Conflict if someone edited it
        await memory.update(lambda text: text + "- likes tea\\n")   # applied to the newest text
    """

    def __init__(
        self, path: Path, *, limits: Limits = Limits(), exchange: bool = True, read_only: bool = False
    ) -> None:
        """``read_only``: for a reader beside the running bot (``membot memory show|stats``): reads take
        the file as it is, merging nothing into it and taking no lock (no lock file either), and a
        write is a bug (``RuntimeError``)."""
        self._path = path
        self._read_only = read_only
        self._replaced = ReplacedLines(path.with_name(REPLACED_NAME), max_bytes=limits.replaced_max_bytes)
        self._max_bytes = limits.max_bytes
        self._read_cap = limits.max_bytes + READ_MARGIN
        self._exchange = exchange
        self._files = FileSwapper(path, read_cap=self._read_cap, exchange=exchange)
        self._snapshots = SnapshotCache(path, max_bytes=self._max_bytes, read_cap=self._read_cap)
        self._lock = asyncio.Lock()
        self._looked = False  # for versions a failed write left beside the file (strays.py)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def replaced_path(self) -> Path:
        """The lines bot writes removed, oldest first (append-only; rotated to MEMORY.replaced.1.md)."""
        return self._replaced.path

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @property
    def read_cap(self) -> int:
        """The most of the file the bot reads (``max_bytes`` + :data:`READ_MARGIN`); it never writes more."""
        return self._read_cap

    async def read(self) -> Snapshot:
        """The current text; re-read from disk only when its mtime, size or inode changed."""
        if self._read_only:
            if not self._looked:
                await asyncio.to_thread(self._look_only)
            return await asyncio.to_thread(self._snapshots.read)
        if not self._looked or self._files.watching:
            async with self._lock:
                await asyncio.to_thread(self._rescue_if_needed)
        return await asyncio.to_thread(self._snapshots.read)

    def _look_only(self) -> None:
        """Read-only: say when versions a failed or killed write left beside the file wait to be merged
        (the bot or ``membot memory edit`` merges them at its next read); what is read leaves them out."""
        self._follow_link()
        self._files.look()
        self._looked = True
        if self._files.watching:
            log.warning(
                "memory_file_versions_waiting",
                file=str(self._path),
                hint="versions a write left beside it are not shown here: the bot merges them into it "
                "when it next reads the file",
            )

    def _rescue_if_needed(self) -> None:
        """Merge what an editor wrote into a version a bot write displaced and, at the first read, an
        operator's save a failed write left beside the file (strays.py). Nothing to merge: no lock
        file either (a chat's folder is made only when the bot first writes there)."""
        self._follow_link()
        self._files.look()
        self._looked = True
        if self._files.watching:
            with self._files.lock():
                self._rescue(reading=True)

    async def write(self, text: str, *, expected: str) -> Snapshot:
        """Replace the file with ``text`` if it still has the content hash ``expected``."""

        def change(current: str) -> str:
            if content_hash(current) != expected:
                raise Conflict(f"{self._path.name} changed since it was read")
            return text

        return await self._run(change)

    async def update(self, change: Change) -> Snapshot:
        """Apply ``change`` to the newest text (re-applied if an editor saves meanwhile)."""
        return await self._run(change)

    async def replace_from(self, base: Snapshot, proposed: str) -> tuple[Snapshot, bool]:
        """Write ``proposed`` (derived from ``base``); if the file moved since, merge it into the newer text.

        Returns the snapshot written and whether a merge was needed. Lines the operator added or kept
        survive; lines the bot dropped from ``base`` are dropped; lines the bot added are appended.
        """

        merged = False

        def change(current: str) -> str:
            nonlocal merged
            merged = current != base.text
            return merge_lines(base.text, proposed, current) if merged else proposed

        return await self._run(change), merged

    def apply_operator_edit(self, start: str, edited: str) -> bool:
        """``membot memory edit``: put the operator's ``edited`` text (begun from ``start``) in place.

        Blocking; takes the same lock as the bot. If the bot wrote meanwhile, its change is merged
        into the operator's text (their version wins). Returns whether a merge was needed.
        """

        merged = False

        def change(current: str) -> str:
            nonlocal merged
            merged = current != start
            return merge_lines(start, current, edited) if merged else edited

        self._locked(lambda: self._apply(change, writer="membot memory edit", limit=False, operator=True))
        return merged

    # -- the write path (worker thread, under the asyncio lock and the file lock) -----------------------

    async def _run(self, change: Change) -> Snapshot:
        async with self._lock:
            return await asyncio.to_thread(self._locked, lambda: self._apply(change))

    def _locked(self, work: Callable[[], T]) -> T:
        if self._read_only:
            raise RuntimeError(f"{self._path} was opened read-only")
        self._follow_link()
        with self._files.lock():
            self._rescue()
            return work()

    def _follow_link(self) -> None:
        """Write where a symlinked MEMORY.md points (a dotfiles repository, say): swapping the link's
        own name would replace the link with a file. Followed on every write, so a moved link is too."""
        real = Path(os.path.realpath(self._path))
        if real != self._files.path:
            own = real.parent == Path(os.path.realpath(self._path.parent))
            self._files = FileSwapper(real, read_cap=self._read_cap, exchange=self._exchange, own_folder=own)

    def _rescue(self, *, reading: bool = False) -> None:
        """Merge in what an editor wrote into versions that lost their name to a bot write (late_edits.py)."""
        edits = self._files.late_writes(reading=reading)
        for i, edit in enumerate(edits):
            writer = (
                "a restore of dropped lines"
                if edit.restores
                else "a version a failed write left"
                if edit.kept
                else "a late edit"
            )
            try:
                merge = functools.partial(merge_lines, edit.seen, edit.now)
                self._apply(merge, writer=writer, limit=False, deliberate=False)
            except (Conflict, NotUtf8, ReadOnly):  # still being edited, not UTF-8, read-only: merged later
                self._files.defer(edits[i:], pause=True)
                return
            except MemoryFull as exc:  # the file, or the merge, is more than the bot reads: it waits too
                self._files.defer(edits[i:], pause=True)
                log.warning(
                    "memory_late_edit_waiting",
                    file=str(self._path),
                    edits=len(edits) - i,
                    reason=str(exc),
                    hint=f"shorten {self._path.name} in an editor to under {self._read_cap} bytes; the bot "
                    "merges the edit at a read after that",
                )
                return
            except BaseException:
                # Kept as well, whatever else stopped it (a full disk): the displaced version is gone
                # from the folder, and this is all that is left of it.
                self._files.defer(edits[i:])
                raise
            if edit.kept is not None:  # the only copy of an operator's save, merged: it may go now
                strays.remove(edit.kept)
                log.warning("memory_stranded_version_merged", file=str(self._path), kept=edit.kept)
            elif edit.restores:  # an editor saved from a version that briefly lacked them (late_edits.py)
                log.warning("memory_lines_restored", file=str(self._path), lines=edit.now.count("\n"))
            else:
                log.warning("memory_late_edit_merged", file=str(self._path), chars=len(edit.now))

    def _apply(
        self,
        change: Change,
        *,
        writer: str = "the bot",
        limit: bool = True,
        deliberate: bool = True,
        operator: bool = False,
    ) -> Snapshot:
        """Apply ``change`` to the current text and swap the result in; start over if someone saves.
        ``operator``: the operator's own save, written as they saved it, even over a file they made
        read-only; any other write is refused there, and takes the file's line endings and BOM."""
        deadline = time.monotonic() + MAX_CAS_SECONDS
        logged: list[str] = []
        while True:
            try:  # every write reads the file whole: not one it would not read whole for the prompt
                found = self._settled_read(deadline)
            except TooLarge:
                self._snapshots.too_large(self._read_cap + 1)
                raise MemoryFull(
                    f"{self._path.name} holds more than the bot reads ({self._read_cap} bytes), so it was "
                    "not changed. Ask the operator to shorten it."
                ) from None
            if found is not None and not found.utf8:
                log.error("memory_file_not_utf8", file=str(self._path), writer=writer)
                raise NotUtf8(
                    f"{self._path.name} is not UTF-8 text (it was saved in another encoding), so it was "
                    "not changed: a write would damage its other lines. Ask the operator to save it as UTF-8."
                )
            if found is not None and not found.writable and not operator:
                read_only_refused(self._path, writer)
                raise ReadOnly(
                    f"{self._path.name} was made read-only by the operator, so it was not changed "
                    "(no write can change it until they make it writable again)."
                )
            base = found.text if found else ""
            new = change(base) if operator else in_style_of(base, change(base))
            self._check_size(base, new, limit=limit)
            if new == base:
                break
            logged = self._replaced.keep(base, new, writer, logged)
            if self._files.swap(new, based_on=found, deliberate=deliberate):
                break
            if time.monotonic() > deadline:
                raise Conflict(f"{self._path.name} kept changing for {MAX_CAS_SECONDS:g} s; gave up")
        self._snapshots.forget()
        return self._snapshots.read()

    def _settled_read(self, deadline: float) -> Version | None:
        """The current version, unless it shrank while another program is writing it: then wait.

        An editor that saves by truncating and rewriting leaves the file empty or half-written for a
        moment (much longer on a busy machine); a change based on that, swapped in and read back by
        the editor, lost the operator's lines. So a file that shrank since we last saw it is not used
        while the kernel says it is open for writing (or, where it cannot tell, until it stops
        changing). A file that grew is used at once: what is still being appended lands in the
        version our swap displaces, which is watched (see late_edits.py).
        """
        while True:
            busy = self._files.being_written()
            found = self._files.read()
            size = found.stamp[1] if found is not None else 0
            if busy is False or size >= len(self._snapshots.last.text.encode("utf-8")):
                return found
            time.sleep(_SETTLE_PAUSE)
            if busy is None and self._files.read() == found:
                return found  # stable: a deliberate cut, not a save in progress
            if time.monotonic() > deadline:
                raise Conflict(
                    f"{self._path.name} shrank and has been open for writing by another program for "
                    f"{MAX_CAS_SECONDS:g} s; not writing it meanwhile"
                )

    def _check_size(self, old: str, new: str, *, limit: bool) -> None:
        """``limit``: the bot's own write, which may not grow the file past ``max_bytes``; no write, not
        even the operator's through ``membot memory edit`` or a late edit's merge, makes it more than
        the bot reads back whole."""
        size = len(new.encode("utf-8"))
        if limit and size > self._max_bytes and size > len(old.encode("utf-8")):
            raise MemoryFull(
                f"{self._path.name} would grow to {size} bytes, over its limit of {self._max_bytes} "
                "(memory.max_memory_hard_size); keep facts short, merge or remove lines instead"
            )
        if size > self._read_cap:
            raise MemoryFull(
                f"{self._path.name} would be {size} bytes, more than the bot reads ({self._read_cap}), "
                "so it was not changed"
            )
