"""Reading MEMORY.md: a snapshot of its text, read again only when the file changed, never past a cap.

The bot reads MEMORY.md for every message, so :class:`SnapshotCache` keeps the last :class:`Snapshot`
and reads the file again only when its mtime, size, inode or mode changed (an operator's save in any editor
changes one of them). A file past ``max_bytes`` is logged when read (``memory_file_over_limit``): the
prompt shows only its start. One past ``read_cap`` is not even read whole (a multi-GB one took the
process down): only its start is, and ``memory_file_too_large`` is logged; longterm.py then refuses the
bot's own writes, never cutting the file.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from stat import S_IWUSR

import structlog

from bot.memory.versions import read_head

log = structlog.get_logger(__name__)


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Snapshot:
    """MEMORY.md as read: its text (only its start when not ``whole``) and its size on disk in bytes;
    ``writable`` is False when the operator made the file read-only (the bot then writes it no more)."""

    text: str
    hash: str
    size: int = 0
    whole: bool = True
    writable: bool = True


class SnapshotCache:
    """MEMORY.md as last read, with an mtime-checked cache (blocking; use a thread).

    Usage::

        snap = cache.read()   # from disk only when the file changed since the last read
        cache.forget()        # after a write of ours: the next read reads the file
    """

    def __init__(self, path: Path, *, max_bytes: int, read_cap: int) -> None:
        self._path = path
        self._max_bytes = max_bytes
        self._read_cap = read_cap
        self._stamp: tuple[int, int, int, int] | None = None
        self._cached = Snapshot("", content_hash(""))

    @property
    def last(self) -> Snapshot:
        """The snapshot the last :meth:`read` returned (an empty one before the first)."""
        return self._cached

    def forget(self) -> None:
        self._stamp = None

    def read(self) -> Snapshot:
        """The current text; re-read from disk only when its mtime, size, inode or mode changed."""
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            self._stamp, self._cached = None, Snapshot("", content_hash(""))
            return self._cached
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode)  # (a chmod changes no mtime)
        if stamp != self._stamp:
            data, whole = read_head(self._path, self._read_cap)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:  # shown with U+FFFD; the bot does not write it (NotUtf8)
                text = data.decode("utf-8", errors="replace")
                log.warning("memory_file_not_utf8", file=str(self._path), at_byte=exc.start)
            size = len(data) if whole else max(st.st_size, self._read_cap + 1)
            if not whole:
                self.too_large(size)
            elif size > self._max_bytes:  # the prompt shows its start only, and bot writes cannot grow it
                log.warning(
                    "memory_file_over_limit",
                    file=str(self._path),
                    bytes=size,
                    limit=self._max_bytes,
                    hint="the model sees only its start (memory.inject_max_bytes) and the bot adds no "
                    "line to it; shorten it (membot memory edit) or raise memory.max_memory_hard_size",
                )
            writable = bool(st.st_mode & S_IWUSR)
            self._stamp, self._cached = stamp, Snapshot(text, content_hash(text), size, whole, writable)
        return self._cached

    def too_large(self, size: int) -> None:
        """Log that the file holds ``size`` bytes, more than the bot reads (``read_cap``)."""
        log.warning(
            "memory_file_too_large",
            file=str(self._path),
            bytes=size,
            read=self._read_cap,
            limit=self._max_bytes,
            hint=f"the bot reads only its first {self._read_cap} bytes, shows the model their start and "
            "does not write it; shorten it in an editor or raise memory.max_memory_hard_size",
        )
