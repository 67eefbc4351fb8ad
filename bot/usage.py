"""Usage accounting: tokens and cost per session (on the session) and per day (the usage ledger).

The ledger is ``<workspace>/usage.json``: ``{"version": 1, "days": {"YYYY-MM-DD": {usage}}}`` in the
configured time zone, across all sessions, the last ``keep_days`` days. It is written atomically but
not after every turn: at most every ``flush_interval`` seconds and on :meth:`UsageLedger.flush`
(shutdown), so a crash can lose the last few seconds of *daily* figures; the per-session figures
are saved with the session itself, every turn.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import structlog

from bot.domain import Session, Usage, utcnow
from bot.storage import atomic_write_text

log = structlog.get_logger(__name__)

LEDGER_VERSION = 1


class UsageLedger:
    """Daily usage totals of the whole bot, for ``/status`` ("today").

    ledger = UsageLedger(workspace / "usage.json", tz=ZoneInfo("Europe/Berlin"))
    await ledger.add(turn.usage)
    today = await ledger.day()
    """

    def __init__(
        self,
        path: Path,
        *,
        tz: ZoneInfo,
        clock: Callable[[], datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        flush_interval: float = 10.0,
        keep_days: int = 400,
    ) -> None:
        self._path = path
        self._tz = tz
        self._clock = clock
        self._monotonic = monotonic
        self._interval = flush_interval
        self._keep_days = keep_days
        self._days: dict[str, Usage] | None = None
        self._lock = asyncio.Lock()
        self._dirty = False
        self._last_write = float("-inf")

    @property
    def path(self) -> Path:
        return self._path

    def today(self) -> date:
        return self._clock().astimezone(self._tz).date()

    async def add(self, usage: Usage) -> None:
        """Add one turn's usage to today's total (written now or at the next flush)."""
        if not (usage.calls or usage.input_tokens or usage.output_tokens):
            return
        async with self._lock:
            days = await self._loaded()
            days.setdefault(self.today().isoformat(), Usage()).add(usage)
            self._dirty = True
            if self._monotonic() - self._last_write >= self._interval:
                await self._write(days)

    async def day(self, which: date | None = None) -> Usage:
        """The total of one day (default: today); a copy."""
        async with self._lock:
            days = await self._loaded()
        found = days.get((which or self.today()).isoformat())
        return Usage.from_dict(found.to_dict()) if found else Usage()

    async def flush(self) -> None:
        """Write pending figures (call on shutdown)."""
        async with self._lock:
            if self._dirty and self._days is not None:
                await self._write(self._days)

    async def _loaded(self) -> dict[str, Usage]:
        if self._days is None:
            self._days = await asyncio.to_thread(self._read)
        return self._days

    def _read(self) -> dict[str, Usage]:
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
            return {str(k): Usage.from_dict(v) for k, v in dict(data["days"]).items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # Daily figures are informational: start over rather than stop the bot, but keep the file.
            aside = self._path.with_name(f"{self._path.name}.corrupt")
            log.error("usage_ledger_unreadable", path=str(self._path), error=str(exc), moved_to=aside.name)
            self._path.replace(aside)
            return {}

    async def _write(self, days: dict[str, Usage]) -> None:
        for old in sorted(days)[: max(0, len(days) - self._keep_days)]:
            del days[old]
        text = json.dumps(
            {"version": LEDGER_VERSION, "days": {k: v.to_dict() for k, v in sorted(days.items())}},
            indent=1,
        )
        await asyncio.to_thread(atomic_write_text, self._path, text)
        self._dirty = False
        self._last_write = self._monotonic()


async def record_usage(session: Session, usage: Usage, ledger: UsageLedger | None) -> None:
    """Add a turn's usage to the session's totals and to today's ledger.

    Called once per turn after the model calls (the usage pipeline system does it); the session's
    figures are saved with the session by the dispatcher.
    """
    session.usage.add(usage)
    if ledger is not None:
        await ledger.add(usage)
