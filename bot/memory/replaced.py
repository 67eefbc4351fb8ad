"""MEMORY.replaced.md: the lines bot writes removed from MEMORY.md, kept so a bad write can be undone.

Each bot write of MEMORY.md (longterm.py) first appends the lines it removes here, so a consolidation that
drops a fact it should have kept can be undone (lines it only adds cost nothing here; it used to copy the
whole file each time and reached 17 MB after 500 writes). Past ``memory.replaced_max_size`` the file
moves to ``MEMORY.replaced.1.md`` (the previous one goes, with a warning in the log).
"""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime
from pathlib import Path

import structlog

from bot.storage import append_bytes, fsync_dir

log = structlog.get_logger(__name__)

REPLACED_NAME = "MEMORY.replaced.md"
ROTATED_NAME = "MEMORY.replaced.1.md"
DEFAULT_REPLACED_MAX_BYTES = 1_048_576


class ReplacedLines:
    """The append-only record of removed lines beside one MEMORY.md, oldest first (blocking).

    Usage, before each write that changes ``old`` into ``new``::

        logged = replaced.keep(old, new, "the bot", logged)   # logged: [] at the first attempt
    """

    def __init__(self, path: Path, *, max_bytes: int = DEFAULT_REPLACED_MAX_BYTES) -> None:
        self._path = path
        self._max_bytes = max_bytes

    @property
    def path(self) -> Path:
        return self._path

    def keep(self, old: str, new: str, writer: str, logged: list[str]) -> list[str]:
        """Append the lines ``new`` drops from ``old`` (rotating the file when full).

        ``logged`` is what an earlier attempt of the same write already kept; it is not kept twice.
        """
        remaining = set(new.splitlines())
        removed = list(dict.fromkeys(ln for ln in old.splitlines() if ln.strip() and ln not in remaining))
        if not removed or set(removed) <= set(logged):
            return logged
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        block = f"## {stamp} — removed by {writer}\n\n" + "\n".join(removed) + "\n\n"
        data = block.encode("utf-8")
        with contextlib.suppress(FileNotFoundError):
            if os.path.getsize(self._path) + len(data) > self._max_bytes:
                self._rotate()
        append_bytes(self._path, data, whole_lines=True)
        return [*logged, *removed]

    def _rotate(self) -> None:
        rotated = self._path.with_name(ROTATED_NAME)
        with contextlib.suppress(FileNotFoundError):
            dropped = os.path.getsize(rotated)
            log.warning("memory_backup_rotated", dropped=str(rotated), bytes=dropped)
        os.replace(self._path, rotated)
        fsync_dir(self._path.parent)
