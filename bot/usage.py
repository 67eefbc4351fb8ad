"""Usage accounting: tokens and cost per session (on the session) and per day (the usage ledger).

The ledger is ``<workspace>/usage.json``: ``{"version": 1, "days": {"YYYY-MM-DD": {usage, "purposes":
{"chat": {usage}, "compaction": {usage}, ...}}}}`` in the configured time zone, across all sessions,
the last ``keep_days`` days. The LLM client reports every call to it with its purpose (chat turns,
compaction summaries, memory consolidation), so the day's total is what the provider bills. It is
written atomically but not after every call: at most every ``flush_interval`` seconds and on
:meth:`UsageLedger.flush` (shutdown), so a crash can lose the last few seconds of *daily* figures;
the per-session figures (chat turns) are saved with the session itself, every turn.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import structlog

from bot.domain import Session, Usage, utcnow
from bot.storage import atomic_write_text

log = structlog.get_logger(__name__)

LEDGER_VERSION = 1


@dataclass(slots=True)
class _Day:
    total: Usage = field(default_factory=Usage)
    purposes: dict[str, Usage] = field(default_factory=dict)

    def add(self, usage: Usage, purpose: str) -> None:
        self.total.add(usage)
        self.purposes.setdefault(purpose, Usage()).add(usage)

    def to_dict(self) -> dict[str, Any]:
        purposes = {name: u.to_dict() for name, u in sorted(self.purposes.items())}
        return {**self.total.to_dict(), "purposes": purposes}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> _Day:
        purposes = data.get("purposes")
        if not isinstance(purposes, dict):  # written before purposes were kept: chat turns only
            purposes = {"chat": data}
        return cls(Usage.from_dict(data), {str(k): Usage.from_dict(v) for k, v in purposes.items()})


class UsageLedger:
    """Daily usage totals of the whole bot, per purpose, for ``/status`` ("today").

    ledger = UsageLedger(workspace / "usage.json", tz=ZoneInfo("Europe/Berlin"))
    llm = LLMClient(settings.llm, catalog, http, usage=ledger)  # every call is recorded
    today = await ledger.day()
    split = await ledger.purposes()  # {"chat": Usage, "compaction": Usage, ...}
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
        self._days: dict[str, _Day] | None = None
        self._lock = asyncio.Lock()
        self._dirty = False
        self._last_write = float("-inf")

    @property
    def path(self) -> Path:
        return self._path

    def today(self) -> date:
        return self._clock().astimezone(self._tz).date()

    async def add(self, usage: Usage, purpose: str = "chat") -> None:
        """Add usage to today's total and its purpose's (written now or at the next flush)."""
        if not (usage.calls or usage.input_tokens or usage.output_tokens):
            return
        async with self._lock:
            days = await self._loaded()
            days.setdefault(self.today().isoformat(), _Day()).add(usage, purpose)
            self._dirty = True
            if self._monotonic() - self._last_write >= self._interval:
                await self._write(days)

    async def record(self, purpose: str, model: str, usage: Usage) -> None:
        """One model call (the LLM client's usage observer)."""
        await self.add(usage, purpose)

    async def day(self, which: date | None = None) -> Usage:
        """The total of one day (default: today); a copy."""
        found = await self._day(which)
        return Usage.from_dict(found.total.to_dict()) if found else Usage()

    async def purposes(self, which: date | None = None) -> dict[str, Usage]:
        """One day's usage per purpose (default: today); copies."""
        found = await self._day(which)
        return {k: Usage.from_dict(v.to_dict()) for k, v in found.purposes.items()} if found else {}

    async def _day(self, which: date | None) -> _Day | None:
        async with self._lock:
            days = await self._loaded()
        return days.get((which or self.today()).isoformat())

    async def flush(self) -> None:
        """Write pending figures (call on shutdown)."""
        async with self._lock:
            if self._dirty and self._days is not None:
                await self._write(self._days)

    async def _loaded(self) -> dict[str, _Day]:
        if self._days is None:
            self._days = await asyncio.to_thread(self._read)
        return self._days

    def _read(self) -> dict[str, _Day]:
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
            return {str(k): _Day.from_dict(v) for k, v in dict(data["days"]).items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # Daily figures are informational: start over rather than stop the bot, but keep the file.
            aside = self._path.with_name(f"{self._path.name}.corrupt")
            log.error("usage_ledger_unreadable", path=str(self._path), error=str(exc), moved_to=aside.name)
            self._path.replace(aside)
            return {}

    async def _write(self, days: dict[str, _Day]) -> None:
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
    """Add a turn's usage to the session's totals and, when given, to today's ledger.

    Called once per turn after the model calls (the usage pipeline system does it); the session's
    figures are saved with the session by the dispatcher. The composition root passes no ledger when
    the LLM client already reports every call to it (that would count chat calls twice).
    """
    session.usage.add(usage)
    if ledger is not None:
        await ledger.add(usage)
