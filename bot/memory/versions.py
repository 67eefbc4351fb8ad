"""A version of a file as read: its text and its stamp (inode, size, mtime), whole or up to a cap.

:class:`~bot.memory.swap.FileSwapper` compares stamps to tell whether a file is still the version a
change was based on, late_edits.py reads displaced versions through descriptors it keeps open, and
strays.py reads the versions a swap left beside the file. Every read has a cap (:func:`read_head`,
``read_bytes(fd, at_most)``): an operator's multi-GB MEMORY.md, or a version an editor wrote as large,
is never read whole (longterm.py).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from bot.memory.exchange import Stamp


def stamp_of(fd: int) -> Stamp:
    info = os.fstat(fd)
    return info.st_ino, info.st_size, info.st_mtime_ns


def writable(fd: int) -> bool:
    """Whether the file's owner may write it: by its mode, not by :func:`os.access` (root may write
    any file, and a bot run as root must still leave alone one the operator made read-only)."""
    return bool(os.fstat(fd).st_mode & stat.S_IWUSR)


@dataclass(frozen=True, slots=True)
class Version:
    """A version of the file as read: its text and stamp."""

    text: str
    stamp: Stamp
    utf8: bool = True  # False: not UTF-8 (an editor saved another encoding); ``text`` shows U+FFFD there
    writable: bool = True  # False: the operator took its owner's write permission away (``chmod a-w``)


class TooLarge(Exception):
    """The file holds more than the reader takes (:func:`read_bytes`); none of it is used."""


def read_text(fd: int, at_most: int) -> str:
    """The file's text (bytes not UTF-8 shown as U+FFFD); :class:`TooLarge` past ``at_most`` bytes."""
    return read_bytes(fd, at_most).decode("utf-8", errors="replace")


def read_bytes(fd: int, at_most: int) -> bytes:
    """The file's bytes; :class:`TooLarge` past ``at_most`` bytes, of which no more than one more is read."""
    chunks: list[bytes] = []
    offset = 0
    while offset <= at_most:
        if not (chunk := os.pread(fd, min(1 << 20, at_most + 1 - offset), offset)):
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)
    raise TooLarge(f"the file holds more than {at_most} bytes")


def read_head(path: Path, cap: int) -> tuple[bytes, bool]:
    """The file's bytes and True; or, when it holds more than ``cap``, only its start (to the end of its
    last whole line, else of its last whole character) and False. No more than ``cap + 1`` is read."""
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    if len(data) <= cap:
        return data, True
    end = data.rfind(b"\n", 0, cap) + 1
    if not end:  # one line longer than that: cut before the character ``cap`` falls in
        end = cap
        while end and data[end] & 0xC0 == 0x80:  # a continuation byte: inside a character
            end -= 1
    return data[:end], False
