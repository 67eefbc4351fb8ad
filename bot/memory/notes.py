"""Daily notes: one ``memory/YYYY-MM-DD.md`` file per local day, one line per answered turn.

They are the cheapest memory there is: always written, human-readable, and shown to the model as
"today" and "the last few days" so short-term continuity survives session trims and restarts.
"""

from __future__ import annotations

import asyncio
import re
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

USER_CHARS = 200
ASSISTANT_CHARS = 300
_SPACE = re.compile(r"\s+")


def fold(text: str, limit: int) -> str:
    """One line of at most ``limit`` characters: newlines and runs of spaces become one space."""
    flat = _SPACE.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def note_line(when: datetime, user: str, assistant: str) -> str:
    return f"[{when:%H:%M}] User: {fold(user, USER_CHARS)} | Assistant: {fold(assistant, ASSISTANT_CHARS)}"


def not_yet_in(path: Path, lines: list[str]) -> list[str]:
    """``lines`` that ``path`` does not hold yet: replaying an import a second time adds nothing."""
    try:
        present = set(path.read_text(encoding="utf-8", errors="replace").splitlines())
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
        try:
            text = self.path_for(day).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        lines = [line for line in text.splitlines() if line.strip()]
        return lines[-max_lines:] if max_lines > 0 else []

    async def recent(self, now: datetime, days: int, *, max_lines: int) -> list[tuple[date, list[str]]]:
        """The ``days`` days before today, newest first, skipping days without notes."""
        today = self.local(now).date()
        out: list[tuple[date, list[str]]] = []
        for back in range(1, days + 1):
            day = today - timedelta(days=back)
            lines = await self.read_day(day, max_lines=max_lines)
            if lines:
                out.append((day, lines))
        return out
