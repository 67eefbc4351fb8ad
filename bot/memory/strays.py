"""Versions a swap left beside the file under its temp name: the operator's save may be one of them.

:meth:`~bot.memory.swap.FileSwapper.swap` writes the bot's version to a temp file and trades names with
the file. Until that temp name is removed it holds a version that is not the bot's: the one it displaced,
or, when an editor saved in between and the exchange back failed (:class:`~bot.memory.exchange.Stranded`)
or a kill came between the two exchanges, the operator's save, of which it is the only copy. So a swap's
temp name is not the shape the start-up cleanup removes after a minute (``bot/storage.py``): it ends in
``.swap`` and carries the inode of the bot's version and the stamp of the version the swap was based on,
which tell the kinds apart at the next use of the file, found by :func:`collect`:

- the bot's own version (a kill before the exchange, or after the exchange back) is removed: it never
  stood in place, and merging it would bring back lines the operator deleted since;
- so is the version the swap displaced, untouched since it was read (a kill after the exchange, before
  it was let go): merging it would bring back what the write removed;
- any other is merged back into the file, and only then removed (:func:`remove`); one too large to
  read (past the cap the reader gives) is left where it is, with a warning naming it.

A version that lost its name and is too large to read (an editor wrote that much into it) is copied
here by :func:`keep`, under a name :func:`collect` never takes for the bot's own.

Both run under the file's lock (:meth:`~bot.memory.swap.FileSwapper.lock`), which every swap holds, so a
swap in progress is never taken for a leftover.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import structlog

from bot.memory.exchange import Stamp
from bot.memory.versions import TooLarge, read_bytes
from bot.storage import TEMP_SUFFIX, fsync_dir

log = structlog.get_logger(__name__)

SUFFIX = ".swap"


@dataclass(frozen=True, slots=True)
class Stray:
    """A version that is not the bot's, left under a swap's temp name ``file``: merge, then remove it."""

    file: str
    text: str


def name_for(temp: str, inode: int, base: Stamp | None) -> str:
    """The name a swap's temp file (``mkstemp``'s ``temp``, holding the bot's version, of ``inode``)
    takes; ``base`` is the stamp of the version the swap was based on (``None``: no file yet)."""
    based = "-".join(map(str, base)) if base is not None else "none"
    return f"{temp.removesuffix(TEMP_SUFFIX)}.{inode}.{based}{SUFFIX}"


def _pattern(path: Path) -> re.Pattern[str]:
    name, suffix = re.escape(path.name), re.escape(SUFFIX)
    return re.compile(rf"^\.{name}\.[a-z0-9_]{{8}}\.(\d+)\.(\d+-\d+-\d+|none){suffix}$")


def present(path: Path) -> bool:
    """Whether any swap of ``path`` left a temp file beside it (one look at the folder, no lock)."""
    try:
        names = os.listdir(path.parent)
    except (FileNotFoundError, NotADirectoryError):
        return False
    pattern = _pattern(path)
    return any(pattern.match(name) for name in names)


def collect(path: Path, *, at_most: int) -> list[Stray]:
    """Remove the bot's own versions left beside ``path``; return the others, oldest first, to merge.

    One that is not UTF-8, or holds more than ``at_most`` bytes (read no further), is left where it is,
    with a warning naming it: the merge would turn its other-encoded letters into U+FFFD, or hold more
    than the bot reads, and it is the operator's to look at.
    """
    try:
        names = os.listdir(path.parent)
    except (FileNotFoundError, NotADirectoryError):
        return []
    pattern = _pattern(path)
    found: list[tuple[int, Stray]] = []
    removed = False
    for name in names:
        if (match := pattern.match(name)) is None:
            continue
        file = str(path.parent / name)
        try:
            fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # gone, or a link someone put there: not ours to read
        try:
            info = os.fstat(fd)
            stamp = f"{info.st_ino}-{info.st_size}-{info.st_mtime_ns}"
            # The bot's own version (never in place), or the one its swap displaced, untouched since (a
            # kill before the swap let it go): merging the latter back would undo what the write removed.
            if info.st_ino == int(match.group(1)) or stamp == match.group(2):
                os.unlink(file)
                removed = True
                continue
            data = read_bytes(fd, at_most)
        except TooLarge:
            _kept(path, file, f"holds more than the bot reads ({at_most} bytes)")
            continue
        finally:
            os.close(fd)
        try:
            found.append((info.st_mtime_ns, Stray(file, data.decode("utf-8"))))
        except UnicodeDecodeError:
            _kept(path, file, "is not UTF-8")
    if removed:
        fsync_dir(path.parent)
    return [stray for _, stray in sorted(found, key=lambda pair: pair[0])]


def keep(path: Path, fd: int, cap: int) -> None:
    """Copy the version of ``path`` open at ``fd``, more than ``cap`` bytes (the most the bot reads) and
    without a name, or about to lose it, beside ``path`` under a stray's name, a piece at a time.

    The copy is the operator's to merge by hand (``memory_late_edit_too_large`` names it); shortened
    under ``cap``, it is merged back at the bot's next start like any stray. Its name carries no inode
    or stamp of ours (0, ``none``), so :func:`collect` never removes it as the bot's own version."""
    size = os.fstat(fd).st_size
    hint = (
        f"an editor wrote more than the bot reads ({cap} bytes) into a version of {path.name} that a bot "
        "write had replaced"
    )
    try:
        kept = _copy(path, fd)
    except OSError as exc:  # a full disk, say: there is nowhere else to keep it
        log.error(
            "memory_late_edit_lost",
            file=str(path),
            bytes=size,
            error=str(exc),
            hint=f"{hint}; it could not be copied beside the file",
        )
        return
    log.warning(
        "memory_late_edit_too_large",
        file=str(path),
        kept=kept,
        bytes=size,
        hint=f"{hint}; merge what you need from the copy by hand, then delete it",
    )


def _copy(path: Path, fd: int) -> str:
    out, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        offset = 0
        while chunk := os.pread(fd, 1 << 20, offset):
            offset += len(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]
        os.fsync(out)
        kept = name_for(tmp, 0, None)
        os.rename(tmp, kept)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        os.close(out)
    fsync_dir(path.parent)
    return kept


def _kept(path: Path, file: str, why: str) -> None:
    log.warning(
        "memory_stranded_version_kept",
        file=file,
        hint=f"a version of {path.name} that {why} is kept beside it (an editor saved it while the bot "
        "wrote the file); merge what you need from it by hand, then delete it",
    )


def remove(file: str) -> None:
    """Remove a stray once its text is merged into the file (a crash before this merges it again: the
    lines are then already there)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(file)
        fsync_dir(Path(file).parent)
