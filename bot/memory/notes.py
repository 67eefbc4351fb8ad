"""Daily notes: one ``memory/YYYY-MM-DD.md`` file per local day, one line per answered turn.

They are the cheapest memory there is: always written, human-readable, and shown to the model as
"today" and "the last few days" so short-term continuity survives session trims and restarts. They
are the operator's to edit too, so they are read a line at a time, never whole.
"""

from __future__ import annotations

import asyncio
import collections
import re
from collections.abc import Iterator
from datetime import date, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from bot.storage import wait_for_editors

USER_CHARS = 200
ASSISTANT_CHARS = 300
LINE_MAX = 1 << 16  # bytes of a line read: a note line is a few hundred characters
_SPACE = re.compile(r"\s+")


def fold(text: str, limit: int) -> str:
    """One line of at most ``limit`` characters: newlines and runs of spaces become one space."""
    flat = _SPACE.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def note_line(when: datetime, user: str, assistant: str) -> str:
    return f"[{when:%H:%M}] User: {fold(user, USER_CHARS)} | Assistant: {fold(assistant, ASSISTANT_CHARS)}"


def _lines_of(path: Path) -> Iterator[str]:
    """The lines of ``path`` (bytes not UTF-8 shown as U+FFFD), read one at a time: a note file may be
    as large as an operator made it, and read whole a multi-GB one would end the process. A line
    longer than :data:`LINE_MAX` bytes, which no note is, comes as its start only."""
    with open(path, "rb") as f:
        while piece := f.readline(LINE_MAX):
            if len(piece) == LINE_MAX and not piece.endswith(b"\n"):  # skip the rest of that line
                while (rest := f.readline(LINE_MAX)) and not rest.endswith(b"\n"):
                    pass
            yield from piece.decode("utf-8", errors="replace").splitlines()


def not_yet_in(path: Path, lines: list[str]) -> list[str]:
    """``lines`` that ``path`` does not hold yet: replaying an import a second time adds nothing. Looked
    for once an editor's in-place save is done: the half it has rewritten may lack them."""
    wait_for_editors(path)
    wanted = set(lines)
    try:
        present = {line for line in _lines_of(path) if line in wanted}
    except FileNotFoundError:
        return lines
    return [line for line in lines if line not in present]


class DailyNotes:
    """Append and read the per-day note files, in the configured time zone."""

    def __init__(self, directory: Path, tz: ZoneInfo) -> None:
        self._dir = directory
        self._tz = tz

    def path_for(self, day: date) -> Path:
        return self._dir / f"{day.isoformat()}.md"

    def local(self, when: datetime) -> datetime:
        return when.astimezone(self._tz)

    async def read_day(self, day: date, *, max_lines: int) -> list[str]:
        return await asyncio.to_thread(self._read_day, day, max_lines)

    def _read_day(self, day: date, max_lines: int) -> list[str]:
        if max_lines <= 0:
            return []
        try:
            return list(collections.deque(self._written(day), maxlen=max_lines))
        except FileNotFoundError:
            return []

    async def count_day(self, day: date) -> int:
        """How many notes the day has (a line at a time: the count does not hold them)."""
        return await asyncio.to_thread(self._count_day, day)

    def _count_day(self, day: date) -> int:
        try:
            return sum(1 for _ in self._written(day))
        except FileNotFoundError:
            return 0

    def _written(self, day: date) -> Iterator[str]:
        return (line for line in _lines_of(self.path_for(day)) if line.strip())
