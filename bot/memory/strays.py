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
- any other is merged back into the file, and only then removed (:func:`remove`).

Both run under the file's lock (:meth:`~bot.memory.swap.FileSwapper.lock`), which every swap holds, so a
swap in progress is never taken for a leftover.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import structlog

from bot.memory.exchange import Stamp
from bot.memory.versions import read_bytes
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


def collect(path: Path) -> list[Stray]:
    """Remove the bot's own versions left beside ``path``; return the others, oldest first, to merge.

    One that is not UTF-8 is left where it is, with a warning naming it: the merge would turn its
    other-encoded letters into U+FFFD, and it is the operator's to look at.
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
            data = read_bytes(fd)
        finally:
            os.close(fd)
        try:
            found.append((info.st_mtime_ns, Stray(file, data.decode("utf-8"))))
        except UnicodeDecodeError:
            log.warning(
                "memory_stranded_version_kept",
                file=file,
                hint=f"a version of {path.name} that is not UTF-8 was left by a failed write; "
                "merge what you need from it by hand, then delete it",
            )
    if removed:
        fsync_dir(path.parent)
    return [stray for _, stray in sorted(found, key=lambda pair: pair[0])]


def remove(file: str) -> None:
    """Remove a stray once its text is merged into the file (a crash before this merges it again: the
    lines are then already there)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(file)
        fsync_dir(Path(file).parent)
