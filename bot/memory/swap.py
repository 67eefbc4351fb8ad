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
- What that leaves to check (lines a reader in those few calls may have missed, versions that lost
  their name and an editor may still write into, an editor's save stranded under the temp name when
  the exchange back fails) is watched for a while by late_edits.py's :class:`~bot.memory.late_edits.Watcher`,
  and :meth:`FileSwapper.late_writes` hands it back to be merged in.
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
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bot.memory import strays
from bot.memory.exchange import AVAILABLE, Outcome, Stranded, Unsupported, exchange_if
from bot.memory.late_edits import LateEdit, Watcher
from bot.memory.versions import TooLarge, Version, read_bytes, stamp_of, writable
from bot.storage import FILE_MODE, being_written, ensure_private_dir, fsync_dir


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
        self._watcher = Watcher(path, read_cap=read_cap)
        self._held: int | None = None  # the last version read (see read)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def lock_path(self) -> Path:
        return self._path.with_name(f".{self._path.name}.lock")

    @property
    def watching(self) -> bool:
        """Whether :meth:`late_writes` may have something to hand back now (late_edits.py)."""
        return self._watcher.watching

    def look(self) -> None:
        """At first use: note whether an earlier swap left versions beside the file (then ``watching``:
        :meth:`late_writes` hands them back). One look at the folder, creating nothing."""
        self._watcher.look()

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
        """True while another program has the file open for writing (a save in progress); None when
        the kernel cannot tell (:func:`bot.storage.being_written`)."""
        return being_written(self._path)

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
                version = Version(data.decode("utf-8"), stamp_of(fd), writable=writable(fd))
            except UnicodeDecodeError:
                text = data.decode("utf-8", errors="replace")
                version = Version(text, stamp_of(fd), utf8=False, writable=writable(fd))
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
                    self._watcher.stranded(tmp, based_on)
                    raise
                if outcome is Outcome.MISSING:
                    return self._created(tmp)
                if outcome is Outcome.SWAPPED:
                    self._watcher.displaced(tmp, based_on)
                    return self._done(based_on, text, deliberate)
                if outcome is Outcome.TRADED_BACK:
                    self._watcher.traded_back(tmp, text, based_on, back, ours)
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
        return self._watcher.late_writes(self._present_lines, reading=reading)

    def defer(self, edits: list[LateEdit], *, pause: bool = False) -> None:
        """Keep late edits that could not be merged yet for the next :meth:`late_writes`. ``pause``: what
        stopped them lasts (a file saved in another encoding, one still being written), so a read's
        :meth:`late_writes` hands them back only once :data:`~bot.memory.late_edits.DEFER_PAUSE` has
        passed (a write's at once)."""
        self._watcher.defer(edits, pause=pause)

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
        self._watcher.replaced(fd, based_on)
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

    def _done(self, based_on: Version | None, text: str, deliberate: bool) -> bool:
        """Our version is in place: lines it removed on purpose are no longer guarded."""
        if deliberate:
            self._watcher.unguard(based_on, text)
        return True

    def _present_lines(self) -> set[str] | None:
        """The file's lines now, for the guarded lines (late_edits.py); None while another program has
        the file open for writing: a save half done lacks lines it will have (the next look decides)."""
        if self.being_written():
            return None
        try:
            current = self.read()
        except TooLarge:  # not read whole: every guarded line comes back, merged once it can be
            current = None
        self._release()
        return set(current.text.splitlines()) if current else set()
