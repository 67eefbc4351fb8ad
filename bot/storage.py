"""Crash-safe file primitives: every write of user data in membot goes through here.

A write is either complete or absent. Whole-file writes go to a temp file in the same folder, are
fsynced, renamed over the target and the folder is fsynced. Appends write whole lines and fsync; readers
of append-only logs ignore a torn last line. Folders are created 0700 and files 0600, because the
workspace holds private conversations.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import re
import secrets
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from bot.errors import StorageError
from bot.surrogates import utf8

DIR_MODE = 0o700
FILE_MODE = 0o600
TEMP_SUFFIX = ".tmp"
# What atomic_write_bytes' temp files are called: "." + target name + "." + mkstemp's 8 characters.
_TEMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")
EDITOR_WAIT = 2.0  # seconds an append to an operator's file waits for another program's save to end
_EDITOR_PAUSE = 0.005
_SETLEASE: int | None = getattr(fcntl, "F_SETLEASE", None)  # Linux only
_SETSIG: int = getattr(fcntl, "F_SETSIG", 10)


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if needed and make sure the folder itself is 0700.

    Every write calls it, so the usual case (the folder is there) costs one ``stat``."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        missing = []
        for folder in (path, *path.parents):
            if folder.exists():
                break
            missing.append(folder)
        for folder in reversed(missing):  # every folder we create is private, not just the last one
            folder.mkdir(mode=DIR_MODE, exist_ok=True)
        mode = os.stat(path).st_mode
    if mode & 0o777 != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new content."""
    ensure_private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:40]}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_at(folder: int, name: str, data: bytes) -> None:
    """:func:`atomic_write_bytes` for ``name`` in an open ``folder`` (a descriptor), for a caller that
    reached the folder without following links (bot/tools/workspace_files.py); the temp file has the shape
    :func:`remove_stale_temp_files` knows."""
    temp = f".{name[:40]}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE, dir_fd=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=folder)
        raise
    os.fsync(folder)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, utf8(text))


def append_bytes(
    path: Path,
    data: bytes,
    *,
    truncate_to: int | None = None,
    whole_lines: bool = False,
    sync: bool = True,
    editable: bool = False,
) -> int:
    """Append ``data`` durably and return the file's new size.

    ``editable``: a file an operator edits (a daily note, HISTORY.md). An editor that saves in place
    (truncate, then write: nano, VS Code, vim with ``backupcopy=yes``) writes at its own offset, without
    ``O_APPEND``: a line appended in the middle of its save was written over by the rest of the
    operator's text, or left a fragment of itself behind it. So the append waits while another program
    has the file open for writing (:func:`being_written`), for at most :data:`EDITOR_WAIT` seconds (one
    that keeps it open, a ``cat >> note``, appends too, and is then appended beside).

    ``sync=False`` leaves the fsyncs (of the file, and of its folder when created) to the caller, who
    syncs later with :func:`sync_paths`: for data that can be made again should a power cut lose it.

    ``truncate_to`` first cuts the file back to a known-good length, discarding a torn tail left by a
    crash during an earlier append. ``whole_lines`` starts ``data`` on a line of its own when the file
    does not end with a newline (a torn line, or an operator's edit), so that line cannot swallow the
    first record appended after it. A file this call creates gets its folder fsynced too, so the new
    name survives a power cut along with the data (once per file: later appends need one fsync). A
    symlink to a file not made yet is followed, and the file made where it points.

    Without ``truncate_to`` the file is opened to append (``O_APPEND``): each write lands at the end as
    it is then, so an editor that saves a note in place between our look at the end and our write does
    not get our line written over its text. A failed append (a full disk, a failed fsync) is cut back
    off, as far as the system lets: it raises having left nothing of ``data``, so the caller may take it
    as not written (the inbox: as not accepted) without a complete line of it staying behind. (Not when
    another program wrote the file after it: their text is never cut to take ours out.)
    """
    ensure_private_dir(path.parent)
    if editable:
        wait_for_editors(path)
    append = os.O_APPEND if truncate_to is None else 0
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | append, FILE_MODE)
        created = True
    except FileExistsError:
        try:
            fd = os.open(path, os.O_RDWR | append)
            created = False
        except FileNotFoundError:
            if not os.path.islink(path):
                raise  # (removed in between)
            # A link to a file not made yet (``ln -s ~/dotfiles/x.md``): made where it points, as an
            # editor would; O_EXCL refuses any link, and the open above follows it to nothing.
            path = Path(os.path.realpath(path))
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | append, FILE_MODE)
            created = True
    try:
        if truncate_to is not None and os.fstat(fd).st_size != truncate_to:
            os.ftruncate(fd, truncate_to)
        end = os.lseek(fd, 0, os.SEEK_END)
        if whole_lines and end and os.pread(fd, 1, end - 1) != b"\n":
            data = b"\n" + data
        _write_all(fd, data, sync=sync)
        size = os.lseek(fd, 0, os.SEEK_CUR)  # (with O_APPEND: after our write, wherever the end was)
    finally:
        os.close(fd)
    if created and sync:
        fsync_dir(path.parent)
    return size


def being_written(path: Path) -> bool | None:
    """True while another program has ``path`` open for writing (a save in progress).

    Asked of the kernel with a read lease, which it refuses while the file is open for writing; the
    lease is dropped at once (its break signal is SIGURG, ignored by default, so an editor opening the
    file in that instant only waits for it). None when leases are not available here (another user's
    file, a network filesystem): then the caller can only go by timing.
    """
    if _SETLEASE is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    except OSError:  # (not readable by us: a file made write-only; the caller's own open says more)
        return None
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


def wait_for_editors(path: Path) -> None:
    """Wait while another program has ``path`` open for writing, at most :data:`EDITOR_WAIT` seconds:
    an editor saving it in place, whose text is whole once it closes the file."""
    deadline = time.monotonic() + EDITOR_WAIT
    while being_written(path) and time.monotonic() < deadline:
        time.sleep(_EDITOR_PAUSE)


def _write_all(fd: int, data: bytes, *, sync: bool) -> None:
    """Write (and fsync) ``data`` at the file's end; on failure cut what of it was written, and raise.

    Only while what was written is still the file's tail: an operator who saved the file in place
    meanwhile (a daily note) replaced it, and a cut at our old offset would take their text with it.
    """
    done = 0
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            done += written
            view = view[written:]
        if sync:
            os.fsync(fd)
    except BaseException:
        if done:
            with contextlib.suppress(OSError):  # (a kill between the two leaves a torn tail: readers cope)
                end = os.lseek(fd, 0, os.SEEK_CUR)
                if os.fstat(fd).st_size == end and os.pread(fd, done, end - done) == data[:done]:
                    os.ftruncate(fd, end - done)
        raise


def sync_paths(paths: Iterable[Path], *, new: Iterable[Path] = ()) -> None:
    """fsync files appended with ``sync=False``, then the folders of those among them that are ``new``
    (created by such an append: their names must survive a power cut too), each folder once."""
    folders = dict.fromkeys(path.parent for path in new)
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # rewritten or removed since: whoever did that synced it
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for folder in folders:
        with contextlib.suppress(FileNotFoundError):
            fsync_dir(folder)


def line_bytes(line: str) -> bytes:
    """One text line as appended: UTF-8 (lone surrogates replaced), ending in exactly one newline."""
    return utf8(line.rstrip("\n") + "\n")


def append_line(path: Path, line: str) -> None:
    """Append one text line (a newline is added) durably, on a line of its own."""
    append_bytes(path, line_bytes(line), whole_lines=True)


async def atomic_write_text_async(path: Path, text: str) -> None:
    await asyncio.to_thread(atomic_write_text, path, text)


def fix_private_tree(root: Path, *, bot_writes: Callable[[PurePosixPath], bool] | None = None) -> int:
    """Tighten permissions under ``root`` (folders 0700, files 0600 at most); return how many were changed.

    A file only loses permissions: one its owner may not write (``chmod a-w MEMORY.md``, an operator
    freezing it) stays so, where a chmod to 0600 made it writable again at every start. Except the
    files ``bot_writes`` names (by their path relative to ``root``): the bot's own state, which it
    must write to go on, is made 0600 (a workspace restored read-only left the bot, not root, unable
    to take a message in)."""
    changed = 0
    if not root.exists():
        return 0
    for dirpath, dirnames, filenames in os.walk(root):
        entries = [(Path(dirpath), True)] + [(Path(dirpath) / name, False) for name in filenames]
        for path, folder in entries:
            if path.is_symlink():
                continue
            now = path.stat().st_mode & 0o777
            if folder:
                mode = DIR_MODE
            elif bot_writes is not None and bot_writes(PurePosixPath(path.relative_to(root).as_posix())):
                mode = FILE_MODE
            else:
                mode = now & FILE_MODE
            if now != mode:
                os.chmod(path, mode)
                changed += 1
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
    return changed


def remove_stale_temp_files(root: Path, *, older_than: float = 60.0) -> int:
    """Delete the temp files of writes a kill interrupted under ``root``; return how many.

    Only names :func:`atomic_write_bytes` makes are touched, and only when untouched for
    ``older_than`` seconds: a write in progress (another membot command on the same workspace) is
    never that old, because a temp file lives for the milliseconds of one write. Links are not followed.
    A swap of MEMORY.md names its temp file otherwise on purpose (bot/memory/strays.py): after a failed
    exchange back it holds the operator's save, which the next use of that file merges back.
    """
    removed = 0
    if not root.is_dir():
        return 0
    cutoff = time.time() - older_than
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            if not _TEMP_NAME.match(name):
                continue
            path = Path(dirpath) / name
            with contextlib.suppress(FileNotFoundError):
                info = path.lstat()
                if not stat.S_ISREG(info.st_mode) or info.st_mtime > cutoff:
                    continue
                path.unlink()
                removed += 1
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
    return removed


def refuse_newer(data: Any, ours: int, *, path: Path, what: str, meanwhile: str) -> None:
    """Refuse a file a newer membot wrote (a rollback), as session headers are refused: read as this
    version's, what it holds that this one does not know would be misread, and dropped at the next
    rewrite. :class:`StorageError` names the file, the fix and what the bot does ``meanwhile``; the
    caller leaves the file as it is, never rewritten or moved aside. A version that is no number is
    not refused here (the caller's reading judges that file)."""
    version = data.get("version") if isinstance(data, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > ours:
        raise StorageError(
            f"{what} {path} was written by a newer membot (format {version}; this one reads up to {ours}): "
            f"run that membot again, or restore a backup made with this one; the file is left as it is, "
            f"and {meanwhile}"
        )
