"""What an editor wrote that a swap could have hidden, watched for a while and handed back to be merged.

:meth:`~bot.memory.swap.FileSwapper.swap` puts a new version in place and checks after the fact (see
swap.py); :class:`Watcher` keeps what that leaves to check:

- After a trade-back (an editor saved between the swap's look and its exchange) the exchange was still
  a window of a few system calls: an editor that reads the file then (more likely when the kernel
  preempts us in the middle) gets our version, which lacks the lines it saved a moment before, and its
  next save drops them. So the lines other writers saved by a rename since our base are *guarded* for
  :data:`WATCH_SECONDS` (a file changed in place may hold half a save; the watches below cover those
  editors): :meth:`Watcher.late_writes` hands back any of them that went missing, to be added again. A
  line the bot itself removes is no longer guarded; one an editor's save drops, even on purpose, within
  those seconds of such a race comes back (a visible line the operator can delete again, where the
  alternative was a line silently lost). What a late edit below brings back is guarded the same way:
  the save of an editor that read the file before the merge may drop it again.
- Displaced versions (and, after an exchange back, our own) stay open for a while
  (:data:`WATCH_SECONDS`, at most :data:`MAX_WATCHES`): an editor that opened the file before the
  exchange and writes after it (an append, or a truncate-and-rewrite still in progress) writes into
  one of those, and :meth:`Watcher.late_writes` hands that text back to be merged in.
- Should the exchange back fail (or a kill come between the two exchanges), the editor's version is
  left under the temp name, its only copy: that name is one the start-up cleanup leaves, and the next
  use of the file merges it back (:mod:`bot.memory.strays`).
- No version is read past the ``read_cap`` it is given (a multi-GB MEMORY.md took the process down): a
  version that lost its name and holds more is copied beside the file for the operator
  (:func:`~bot.memory.strays.keep`, ``memory_late_edit_too_large`` in the log), not merged.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from bot.memory import strays
from bot.memory.exchange import Stamp
from bot.memory.versions import TooLarge, Version, read_bytes, read_text, stamp_of
from bot.storage import fsync_dir

WATCH_SECONDS = 10.0
DEFER_PAUSE = 30.0  # seconds before a read tries again edits that could not be merged
MAX_WATCHES = 256


class LateEdit(NamedTuple):
    """Text to merge into the file: what ``now`` has that ``seen`` lacks is added, what it dropped goes."""

    seen: str
    now: str
    restores: bool = False  # guarded lines a save dropped (see above), not an editor's own change
    kept: str | None = None  # the stray file holding ``now`` (strays.py): removed once merged


@dataclass(slots=True)
class _Watch:
    """A version that lost its name, kept open: ``text`` as last read, and the stamp it had then."""

    fd: int
    text: str
    stamp: Stamp
    since: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _Guard:
    """Lines other writers added that a reader may have missed during a trade-back (see above)."""

    lines: set[str]
    since: float = field(default_factory=time.monotonic)


Present = Callable[[], set[str] | None]  # the file's lines now; None while a save is in progress


class Watcher:
    """What the swaps of one file left to check, and the late edits found (blocking; use a thread).

    :class:`~bot.memory.swap.FileSwapper` owns one and tells it what each swap left: a version that
    lost its name (:meth:`displaced`, :meth:`replaced`, :meth:`traded_back`), an editor's save left
    under the temp name (:meth:`stranded`), lines a write removed on purpose (:meth:`unguard`). Its
    :meth:`late_writes` and :meth:`defer` are the swapper's.
    """

    def __init__(self, path: Path, *, read_cap: int) -> None:
        self._path = path
        self._read_cap = read_cap
        self._watches: list[_Watch] = []
        self._guards: list[_Guard] = []
        self._pending: list[LateEdit] = []
        self._retry_at = 0.0  # (monotonic) when deferred edits are worth a read's try again
        self._strays: bool | None = None  # versions a swap left beside the file (None: not looked yet)

    @property
    def watching(self) -> bool:
        """Whether :meth:`late_writes` may have something to hand back now. Edits that could not be
        merged (:meth:`defer`) count again only after :data:`DEFER_PAUSE`: what stopped them (a file
        saved in another encoding, one still being written) lasts, and each read would try again."""
        due = bool(self._pending) and time.monotonic() >= self._retry_at
        return bool(self._watches or self._guards or self._strays or due)

    def look(self) -> None:
        """At first use: note whether an earlier swap left versions beside the file (then ``watching``:
        :meth:`late_writes` hands them back). One look at the folder, creating nothing."""
        if self._strays is None:
            self._strays = strays.present(self._path)

    def late_writes(self, present: Present, *, reading: bool = False) -> list[LateEdit]:
        """(text when it lost its name, text now) for each such version written since; old ones retire.

        ``present`` gives the file's lines now, for the guarded lines (None while another program has
        it open for writing). What comes back is no longer tracked: a caller that cannot merge it now
        hands it to :meth:`defer`.
        """
        if reading and self._pending and time.monotonic() < self._retry_at:
            return []  # edits that could not be merged a moment ago wait (see defer); a write tries them
        found, self._pending = self._pending, []
        if self._strays is not False:  # (under the lock: strays.py)
            found += [
                LateEdit("", stray.text, kept=stray.file)
                for stray in strays.collect(self._path, at_most=self._read_cap)
            ]
            self._strays = False
        now = time.monotonic()
        keep: list[_Watch] = []
        for i, watch in enumerate(self._watches):
            if stamp_of(watch.fd) != watch.stamp:
                if (text := self._text_of(watch.fd)) is None:  # copied beside the file instead
                    os.close(watch.fd)
                    continue
                if text != watch.text:
                    found.append(LateEdit(watch.text, text))
                watch.text, watch.stamp = text, stamp_of(watch.fd)
            if now - watch.since > WATCH_SECONDS or len(self._watches) - i > MAX_WATCHES:
                os.close(watch.fd)  # a last look above, then let the version go
            else:
                keep.append(watch)
        self._watches = keep
        if self._guards:
            found.extend(self._missing_guarded(now, present))
        for edit in found:  # what is merged back may be dropped again by a save already under way
            if not edit.restores and (added := set(edit.now.splitlines()) - set(edit.seen.splitlines())):
                self._guards.append(_Guard({line for line in added if line.strip()}))
        return found

    def defer(self, edits: list[LateEdit], *, pause: bool = False) -> None:
        """Keep late edits that could not be merged yet for the next :meth:`late_writes`. ``pause``: what
        stopped them lasts (a file saved in another encoding, one still being written), so a read's
        :meth:`late_writes` hands them back only once :data:`DEFER_PAUSE` has passed (a write's at once)."""
        self._pending = edits + self._pending
        self._retry_at = time.monotonic() + DEFER_PAUSE if pause else 0.0

    # -- what a swap left ------------------------------------------------------------------------------

    def stranded(self, tmp: str, based_on: Version | None) -> None:
        """The exchange back failed: the editor's save is under ``tmp``, its only copy, and ours is in
        place. Merge their change (from the version ours was based on) back once the file can be
        written; ``tmp`` stays until then, and a restart finds it there (strays.py)."""
        try:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                text = read_bytes(fd, self._read_cap).decode("utf-8")
            finally:
                os.close(fd)
        except (OSError, UnicodeDecodeError, TooLarge):
            self._strays = True  # strays.collect takes it up (or says why not)
            return
        self._pending.append(LateEdit(based_on.text if based_on else "", text, kept=tmp))

    def displaced(self, tmp: str, based_on: Version | None) -> None:
        """Ours is in place; the version it displaced is under the temp name: let it go, but watch it."""
        fd = os.open(tmp, os.O_RDONLY)
        os.unlink(tmp)
        fsync_dir(self._path.parent)
        self.replaced(fd, based_on)

    def replaced(self, fd: int, based_on: Version | None) -> None:
        """Ours is in place and the version it replaced, open at ``fd``, has no name: watch it.

        The stamps matched; a save they cannot see (same size within one clock tick) shows in the text
        and is merged like a late write.
        """
        if (seen := self._text_of(fd)) is None:  # an editor wrote that much into it meanwhile: kept
            os.close(fd)
            return
        if based_on is not None and seen != based_on.text:
            self._pending.append(LateEdit(based_on.text, seen))
        self._watch(fd, seen)

    def traded_back(self, tmp: str, text: str, based_on: Version | None, back: int | None, ours: int) -> None:
        """Theirs is back in place and ours under the temp name: anything written into ours is theirs.

        What others saved by a rename since ``based_on`` (the version put back, or one renamed over
        ours while it had the name) is guarded: a reader in the window saw ours, without those lines.
        A file changed in place is an editor still writing it (it may hold half a save): the watches
        cover those.
        """
        fd = os.open(tmp, os.O_RDONLY)
        theirs: set[str] = set()
        if (now := self._text_of(fd)) is None:  # an editor wrote that much into ours meanwhile: kept
            os.close(fd)
        else:
            if now != text:  # an editor wrote into ours, or renamed its version over ours, meanwhile
                self._pending.append(LateEdit(text, now))
            self._watch(fd, now)
            theirs = set(now.splitlines()) if os.fstat(fd).st_ino != ours else set()
        if back is not None:
            try:
                if based_on is None or os.fstat(back).st_ino != based_on.stamp[0]:
                    theirs |= set(read_text(back, self._read_cap).splitlines())
            except TooLarge:  # the file in place, which the bot does not write (longterm.py): no guard
                pass
            finally:
                os.close(back)
        known = set(text.splitlines()) | set(based_on.text.splitlines() if based_on else ())
        fresh = {line for line in theirs - known if line.strip()}
        if fresh:
            self._guards.append(_Guard(fresh))

    def unguard(self, based_on: Version | None, text: str) -> None:
        """Our version ``text`` is in place: lines it removed on purpose are no longer guarded."""
        if self._guards and based_on is not None:
            removed = set(based_on.text.splitlines()) - set(text.splitlines())
            for guard in self._guards:
                guard.lines -= removed

    # -- helpers ---------------------------------------------------------------------------------------

    def _watch(self, fd: int, text: str) -> None:
        self._watches.append(_Watch(fd, text, stamp_of(fd)))

    def _text_of(self, fd: int) -> str | None:
        """The text of a version that lost its name (or is about to), or None past ``read_cap``: then
        it is not read whole but copied beside the file, for the operator to merge (strays.keep)."""
        try:
            return read_text(fd, self._read_cap)
        except TooLarge:
            strays.keep(self._path, fd, self._read_cap)
            return None

    def _missing_guarded(self, now: float, present: Present) -> list[LateEdit]:
        """Guarded lines no longer in the file, as an edit that adds them; old guards retire after.

        Not while another program has the file open for writing (``present`` gives None): a save half
        done lacks lines it will have (the next look decides)."""
        if (lines := present()) is None:
            return []
        missing = dict.fromkeys(line for g in self._guards for line in sorted(g.lines) if line not in lines)
        self._guards = [g for g in self._guards if g.lines and now - g.since <= WATCH_SECONDS]
        return [LateEdit("", "\n".join(missing) + "\n", restores=True)] if missing else []
