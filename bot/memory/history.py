"""HISTORY.md: the consolidated story of past conversations, one dated entry per consolidation.

Each entry goes to ``HISTORY.md`` and to the month file ``HISTORY-YYYY-MM.md`` (small enough to read), dated
in the configured time zone (the consolidator passes its local time).
When the model could not consolidate, a ``[raw-fallback]`` entry keeps the last messages verbatim so
nothing is lost between the archive and the summary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from bot.domain import Message, Role
from bot.memory.notes import fold
from bot.storage import append_bytes, wait_for_editors

RAW_FALLBACK = "[raw-fallback]"
FALLBACK_MESSAGES = 10
FALLBACK_CHARS = 200
_PIECE = 1 << 20


class HistoryLog:
    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._lock = asyncio.Lock()  # appends from two consolidations must not interleave

    @property
    def main_path(self) -> Path:
        return self._dir / "HISTORY.md"

    def month_path(self, when: datetime) -> Path:
        return self._dir / f"HISTORY-{when:%Y-%m}.md"

    async def append(self, when: datetime, session_id: str, entry: str, *, once: bool = False) -> None:
        """Append the entry to HISTORY.md and its month file; ``once`` skips a file that holds it already
        (a resumed consolidation, which a kill may have stopped after either append)."""
        block = f"## {when.isoformat(timespec='seconds')} — {session_id}\n\n{entry.strip()}\n\n".encode()
        async with self._lock:
            for path in (self.main_path, self.month_path(when)):
                if once and await asyncio.to_thread(_holds, path, block):
                    continue
                await asyncio.to_thread(append_bytes, path, block, whole_lines=True, editable=True)


def raw_fallback_entry(messages: Sequence[Message], reason: str) -> str:
    """The ``[raw-fallback]`` entry: why the model's summary is missing, and the last messages verbatim."""
    tail = [m for m in messages if m.role in (Role.USER, Role.ASSISTANT) and m.content][-FALLBACK_MESSAGES:]
    lines = [f"{RAW_FALLBACK} consolidation failed ({fold(reason, 120)}); last messages:"]
    lines += [f"- {m.role.value.upper()}: {fold(m.content, FALLBACK_CHARS)}" for m in tail]
    return "\n".join(lines)


def _holds(path: Path, block: bytes) -> bool:
    """Whether ``path`` holds ``block``, read a piece at a time: HISTORY.md only grows (and is the
    operator's to edit), and read whole it would take memory the size of the file. Not while an editor
    is saving it in place: the half it has rewritten may lack the block the whole file holds."""
    wait_for_editors(path)
    keep, seen = len(block) - 1, b""  # the end of what was read: the block may start there
    try:
        with open(path, "rb") as f:
            while piece := f.read(_PIECE):
                if block in (seen := seen + piece):
                    return True
                seen = seen[-keep:] if keep else b""
    except FileNotFoundError:
        pass
    return False
