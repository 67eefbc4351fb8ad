"""Replacing a file that an editor may be saving at the same moment, without losing what the editor saved.

An atomic write (temp file, fsync, rename) is safe against crashes but not against a person: an editor
that saves while the bot is between reading the file and renaming its new version over it loses that
save, and an editor that had the file open when the rename happened writes into a file that no longer
has a name. Ordinary editors take no lock, so :meth:`FileSwapper.swap` checks after the fact instead:

- On Linux the new version goes in with ``renameat2(RENAME_EXCHANGE)``: the new file and the current
  one trade names in one step, so the displaced version is still on disk, under the temp name, and is
  compared with the version the change was based on. The same: done. Different: someone saved in
  between, so the two are exchanged back at once (the editor's version is in place again, and an editor
  still writing into it writes into the file that has the name) and the caller starts over from it.
  The editor's text is never deleted and out of place only for a few system calls.
- Those few calls are still a window: an editor that reads the file then (more likely when the kernel
  preempts us in the middle) gets our version, which lacks the lines it saved a moment before, and its
  next save drops them. So after a trade-back the lines other writers saved by a rename since our base
  are *guarded* for :data:`WATCH_SECONDS` (a file changed in place may hold half a save; the watches
  below cover those editors): :meth:`FileSwapper.late_writes` hands back any of them that went
  missing, to be added again. A line the bot itself removes is no longer guarded; one an editor's save
  drops, even on purpose, within those seconds of such a race comes back (a visible line the operator can
  delete again, where the alternative was a line silently lost). What a late edit below brings back is
  guarded the same way: the save of an editor that read the file before the merge may drop it again.
- Displaced versions (and, after an exchange back, our own) stay open for a while
  (:data:`WATCH_SECONDS`, at most :data:`MAX_WATCHES`): an editor that opened the file before the
  exchange and writes after it (an append, or a truncate-and-rewrite still in progress) writes into
  one of those, and :meth:`FileSwapper.late_writes` hands that text back to be merged in.
- Should the exchange back fail (or a kill come between the two exchanges), the editor's version is
  left under the temp name, its only copy: that name is one the start-up cleanup leaves, and the next
  use of the file merges it back (:mod:`bot.memory.strays`).
- Elsewhere (no ``renameat2``, or a filesystem without exchange) a plain rename follows a last
  re-check of the current text; an editor's rename landing between the two is then lost, which is why
  the exchange is preferred.
- No version is read past the swapper's ``read_cap`` (a multi-GB MEMORY.md took the process down): a
  version that lost its name and holds more is copied beside the file for the operator
  (:func:`~bot.memory.strays.keep`, ``memory_late_edit_too_large`` in the log), not merged.

:meth:`FileSwapper.lock` is an advisory ``flock`` on a lock file beside the target for our own
processes (the bot and ``membot memory edit``); the steps above are for everyone else.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from bot.memory import strays
from bot.memory.exchange import AVAILABLE, Outcome, Stamp, Stranded, Unsupported, exchange_if
from bot.memory.versions import TooLarge, Version, read_bytes, read_text, stamp_of
from bot.storage import FILE_MODE, ensure_private_dir, fsync_dir

_SETLEASE: int | None = getattr(fcntl, "F_SETLEASE", None)  # Linux only
_SETSIG: int = getattr(fcntl, "F_SETSIG", 10)
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


class FileSwapper:
    """Puts new versions of one file in place, never over a save it has not seen (blocking; use a thread).

    No version of the file is read past ``read_cap`` bytes. Usage, under :meth:`lock`::

        seen = swapper.read()
        while not swapper.swap(change(seen.text), based_on=seen):
            seen = swapper.read()   # someone saved meanwhile: start over from their version
        for edit in swapper.late_writes():
            ...   # merge what an editor wrote into a version after it lost its name
    """

    def __init__(self, path: Path, *, read_cap: int, exchange: bool = True, own_folder: bool = True) -> None:
        self._path = path
        self._read_cap = read_cap
        self._own_folder = own_folder  # False: a folder a symlink leads to, whose mode is not ours to set
        self._exchange = exchange and AVAILABLE
        self._watches: list[_Watch] = []
        self._guards: list[_Guard] = []
        self._pending: list[LateEdit] = []
        self._retry_at = 0.0  # (monotonic) when deferred edits are worth a read's try again
        self._held: int | None = None  # the last version read (see read)
        self._strays: bool | None = None  # versions a swap left beside the file (None: not looked yet)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def lock_path(self) -> Path:
        return self._path.with_name(f".{self._path.name}.lock")

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

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive advisory lock shared with every membot process that writes this file."""
        if self._own_folder:
            ensure_private_dir(self._path.parent)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def being_written(self) -> bool | None:
        """True while another program has the file open for writing (a save in progress).

        Asked of the kernel with a read lease, which it refuses while the file is open for writing;
        the lease is dropped at once (its break signal is SIGURG, ignored by default, so an editor
        opening the file in that instant only waits for it). None when leases are not available here
        (another user's file, a network filesystem): then the caller can only go by timing.
        """
        if _SETLEASE is None:
            return None
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return False
        try:
            fcntl.fcntl(fd, _SETSIG, signal.SIGURG)
            fcntl.fcntl(fd, _SETLEASE, fcntl.F_RDLCK)
        except OSError as exc:
            return True if exc.errno == errno.EAGAIN else None
        else:
            fcntl.fcntl(fd, _SETLEASE, fcntl.F_UNLCK)
            return False
        finally:
            os.close(fd)

    def read(self) -> Version | None:
        """The current version, or None if the file does not exist; :class:`TooLarge` past ``read_cap``
        bytes (what is read stops there).

        The version stays open until the next read or swap: while it is, no other file can get its
        inode number, so a save by rename never carries the stamp's inode and passes for an edit in
        place (an editor's next temp file often reuses the inode its last rename freed).
        """
        try:
            fd = os.open(self._path, os.O_RDONLY)
        except FileNotFoundError:
            self._release()
            return None
        try:
            data = read_bytes(fd, self._read_cap)
            try:
                version = Version(data.decode("utf-8"), stamp_of(fd))
            except UnicodeDecodeError:
                version = Version(data.decode("utf-8", errors="replace"), stamp_of(fd), utf8=False)
        except BaseException:
            os.close(fd)
            raise
        self._release()
        self._held = fd
        return version

    def swap(self, text: str, *, based_on: Version | None, deliberate: bool = True) -> bool:
        """Put ``text`` in place if the file is still ``based_on`` (None: no file); else change nothing.

        False means someone saved in between: their version is (back) in place; read it and start over.
        ``deliberate``: the lines ``text`` drops are meant to go (not a late edit merged in, which may
        come from a save made from a version that briefly lacked them), so they are no longer guarded.
        """
        tmp = self._temp(text, based_on)
        ours = os.stat(tmp).st_ino
        stranded = False
        try:
            while self._exchange:
                try:
                    outcome, back = exchange_if(tmp, self._path, based_on.stamp if based_on else None)
                except Unsupported:  # this filesystem cannot: plain renames from now on
                    self._exchange = False
                    break
                except Stranded:
                    stranded = True
                    self._stranded(tmp, based_on)
                    raise
                if outcome is Outcome.MISSING:
                    return self._created(tmp)
                if outcome is Outcome.SWAPPED:
                    self._displaced(tmp, based_on)
                    return self._done(based_on, text, deliberate)
                if outcome is Outcome.TRADED_BACK:
                    self._traded_back(tmp, text, based_on, back, ours)
                return False
            return self._renamed(tmp, based_on) and self._done(based_on, text, deliberate)
        finally:
            self._release()
            if not stranded:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def late_writes(self, *, reading: bool = False) -> list[LateEdit]:
        """(text when it lost its name, text now) for each such version written since; old ones retire.

        What comes back is no longer tracked: a caller that cannot merge it now hands it to :meth:`defer`.
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
            found.extend(self._missing_guarded(now))
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

    # -- steps ----------------------------------------------------------------------------------------

    def _temp(self, text: str, based_on: Version | None) -> str:
        if self._own_folder:
            ensure_private_dir(self._path.parent)
        fd, tmp = tempfile.mkstemp(dir=self._path.parent, prefix=f".{self._path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(text.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, FILE_MODE)
            base = based_on.stamp if based_on is not None else None
            kept = strays.name_for(tmp, os.stat(tmp).st_ino, base)  # a name the start-up cleanup leaves
            os.rename(tmp, kept)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return kept

    def _stranded(self, tmp: str, based_on: Version | None) -> None:
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

    def _displaced(self, tmp: str, based_on: Version | None) -> None:
        """Ours is in place; the version it displaced is under the temp name: let it go, but watch it.

        The stamps matched; a save they cannot see (same size within one clock tick) shows in the text
        and is merged like a late write.
        """
        fd = os.open(tmp, os.O_RDONLY)
        os.unlink(tmp)
        fsync_dir(self._path.parent)
        if (seen := self._text_of(fd)) is None:  # an editor wrote that much into it meanwhile: kept
            os.close(fd)
            return
        if based_on is not None and seen != based_on.text:
            self._pending.append(LateEdit(based_on.text, seen))
        self._watch(fd, seen)

    def _traded_back(
        self, tmp: str, text: str, based_on: Version | None, back: int | None, ours: int
    ) -> None:
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

    def _renamed(self, tmp: str, based_on: Version | None) -> bool:
        """Fallback: rename over (just re-checked), then keep the replaced version open for late writes."""
        if based_on is None:
            return self._created(tmp)
        try:
            fd = os.open(self._path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        if stamp_of(fd) != based_on.stamp:  # saved meanwhile: replace nothing
            os.close(fd)
            return False
        os.replace(tmp, self._path)
        fsync_dir(self._path.parent)
        if (current := self._text_of(fd)) is None:  # an editor wrote that much into it meanwhile: kept
            os.close(fd)
            return True
        if current != based_on.text:
            self._pending.append(LateEdit(based_on.text, current))
        self._watch(fd, current)
        return True

    def _created(self, tmp: str) -> bool:
        """There is no file: create it from ``tmp``, never replacing one created meanwhile."""
        try:
            os.link(tmp, self._path)
        except FileExistsError:
            return False
        fsync_dir(self._path.parent)
        return True

    def _release(self) -> None:
        if self._held is not None:
            os.close(self._held)
            self._held = None

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

    def _done(self, based_on: Version | None, text: str, deliberate: bool) -> bool:
        """Our version is in place: lines it removed on purpose are no longer guarded."""
        if deliberate and self._guards and based_on is not None:
            removed = set(based_on.text.splitlines()) - set(text.splitlines())
            for guard in self._guards:
                guard.lines -= removed
        return True

    def _missing_guarded(self, now: float) -> list[LateEdit]:
        """Guarded lines no longer in the file, as an edit that adds them; old guards retire after.

        Not while another program has the file open for writing: a save half done lacks lines it will
        have (the next look decides)."""
        if self.being_written():
            return []
        try:
            current = self.read()
        except TooLarge:  # not read whole: every guarded line comes back, merged once it can be
            current = None
        self._release()
        present = set(current.text.splitlines()) if current else set()
        missing = dict.fromkeys(line for g in self._guards for line in sorted(g.lines) if line not in present)
        self._guards = [g for g in self._guards if g.lines and now - g.since <= WATCH_SECONDS]
        return [LateEdit("", "\n".join(missing) + "\n", restores=True)] if missing else []
