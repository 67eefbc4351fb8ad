"""Usage accounting: tokens and cost per session (on the session) and per day (the usage ledger).

The ledger is ``<workspace>/usage.json``: ``{"version": 1, "days": {"YYYY-MM-DD": {usage, "purposes":
{"chat": {usage}, "compaction": {usage}, ...}}}}`` in the configured time zone, across all sessions,
the last ``keep_days`` days. The LLM client reports every call to it with its purpose (chat turns,
compaction summaries, memory consolidation), so the day's total is what the provider bills. The
per-session figures (chat turns) are saved with the session itself, every turn.

Each call is appended to ``usage.json.journal`` as one line, without an fsync, through a
:class:`GroupWriter` that writes every line queued meanwhile at once: the reply waits for no disk, and a
kill or crash loses at most the calls of the last moment (written lines are in the kernel's hands).
Every ``flush_interval`` seconds (and at close) the totals are written to ``usage.json`` atomically,
with the journal's last line number, and the journal is emptied. A start reads ``usage.json`` and adds
the journal lines past that number, so a crash between the two steps counts nothing twice. Only a power
cut can lose the journal's last lines (torn lines are skipped, and kept aside as
``usage.json.journal.damaged-<hash>``, see ``bot/damaged.py``). Before, a message that came more than
10 s after the last one rewrote ``usage.json`` on the reply path: two fsyncs and a rename per message
at a human pace.

A ``usage.json`` a newer membot wrote (a higher ``version``: a rollback) is refused, as session headers
are: read as this version's, it would be rewritten without what this one does not know. The error is
logged once with the fix; the ledger and its journal are left as they are, this run's calls are not
counted, and /status shows the day's usage as unknown. The bot itself goes on: the figures inform.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import structlog

from bot import damaged
from bot.domain import Session, Usage, utcnow
from bot.errors import StorageError
from bot.group_writer import GroupWriter
from bot.storage import atomic_write_text, line_bytes, refuse_newer

# session.metadata: the catalog id of the model whose answer the chat got last (a fallback's, say): /status
META_ANSWERED_BY = "answered_by"

log = structlog.get_logger(__name__)

LEDGER_VERSION = 1
# What a refused (newer) usage.json means until it is fixed, said with its error.
_MEANWHILE = (
    "until this membot restarts with a ledger it can read, it counts no usage (its calls are missing "
    "from the day's totals; /status shows them as unknown)"
)
JOURNAL_SUFFIX = ".journal"  # beside the ledger: usage.json.journal


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
        flush_interval: float = 300.0,
        keep_days: int = 400,
    ) -> None:
        self._path = path
        self._journal = path.with_name(path.name + JOURNAL_SUFFIX)
        self._tz = tz
        self._clock = clock
        self._interval = flush_interval
        self._keep_days = keep_days
        self._days: dict[str, _Day] | None = None
        self._lock = asyncio.Lock()
        self._dirty = False
        self._line = 0  # number of the last journal line made (or folded into usage.json)
        self._writer = GroupWriter("usage-journal")
        self._later: asyncio.Task[None] | None = None
        self._refused: str | None = None  # why usage.json is not ours to read or write (a newer membot's)

    @property
    def path(self) -> Path:
        return self._path

    def today(self) -> date:
        return self._clock().astimezone(self._tz).date()

    async def add(self, usage: Usage, purpose: str = "chat") -> None:
        """Add usage to today's total and its purpose's (journaled now; in usage.json at the next flush)."""
        if not (usage.calls or usage.input_tokens or usage.output_tokens):
            return
        async with self._lock:
            try:
                days = await self._loaded()
            except StorageError:  # a newer membot's ledger (logged once): this call is not counted
                return
            day = self.today().isoformat()
            days.setdefault(day, _Day()).add(usage, purpose)
            self._line += 1
            line = {"line": self._line, "day": day, "purpose": purpose, "usage": usage.to_dict()}
            # Not awaited: a caller never waits on the disk, and 200 chats' calls do not queue behind
            # each other's writes (the writer takes all lines queued meanwhile at once).
            written = self._writer.submit(self._journal, line_bytes(json.dumps(line)), sync=False)
            written.add_done_callback(self._journal_failed)
            self._dirty = True
        if self._later is None or self._later.done():
            self._later = asyncio.create_task(self._flush_later(), name="usage-ledger-flush")

    async def record(self, purpose: str, model: str, usage: Usage) -> None:
        """One model call (the LLM client's usage observer)."""
        await self.add(usage, purpose)

    async def day(self, which: date | None = None) -> Usage:
        """The total of one day (default: today); a copy. StorageError when usage.json is refused."""
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
        """Write the totals to ``usage.json`` and empty the journal."""
        async with self._lock:
            if self._dirty and self._days is not None:
                await self._write(self._days)

    async def written(self) -> None:
        """Wait until every call so far is in the journal."""
        await self._writer.drain()

    async def close(self) -> None:
        """Stop the timer and flush (on shutdown). A flush storage refuses (a full disk) is logged, not
        raised: the journal keeps what it could write and the next start counts that (on a full disk
        its own appends fail too, and those calls are lost), while raised it failed the shutdown it is
        part of."""
        if self._later is not None:
            self._later.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._later
        await self._flush_logged()

    def _journal_failed(self, written: asyncio.Future[None]) -> None:
        if not written.cancelled() and (exc := written.exception()) is not None:
            # The totals still hold the call; the next flush writes it to usage.json.
            log.error("usage_journal_write_failed", path=str(self._journal), error=str(exc))

    async def _flush_later(self) -> None:
        await asyncio.sleep(self._interval)
        await self._flush_logged()

    async def _flush_logged(self) -> None:
        """:meth:`flush`, a failure logged: the totals keep every figure for the next flush; the journal,
        what it could write."""
        try:
            await self.flush()
        except OSError as exc:
            log.error("usage_ledger_write_failed", path=str(self._path), error=str(exc))

    async def _loaded(self) -> dict[str, _Day]:
        """The days, read once; StorageError (logged the first time) when usage.json is a newer membot's."""
        if self._refused is not None:
            raise StorageError(self._refused)
        if self._days is None:
            try:
                days, self._line = await asyncio.to_thread(self._read)
            except StorageError as exc:
                self._refused = str(exc)
                log.error("usage_ledger_refused", path=str(self._path), error=self._refused)
                raise
            self._days = days
            return days
        return self._days

    def _read(self) -> tuple[dict[str, _Day], int]:
        """The days in ``usage.json`` plus the journal's lines past the one it was written with."""
        days: dict[str, _Day] = {}
        folded = 0
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
            # Before the journal is read: a newer membot's lines past its number are its own.
            refuse_newer(data, LEDGER_VERSION, path=self._path, what="usage ledger", meanwhile=_MEANWHILE)
            days = {str(k): _Day.from_dict(v) for k, v in dict(data["days"]).items()}
            folded = int(data.get("journal", 0))
        except FileNotFoundError:
            pass
        except damaged.UNREADABLE_FILE as exc:
            # Daily figures are informational: start over rather than stop the bot, but keep the file
            # (under a name of its own: an earlier damaged copy is not replaced).
            aside = damaged.corrupt_path(self._path)
            log.error("usage_ledger_unreadable", path=str(self._path), error=str(exc), moved_to=aside.name)
            self._path.replace(aside)
        last = folded
        try:
            data = self._journal.read_bytes()
        except FileNotFoundError:
            data = b""
        unreadable: list[damaged.DamagedLine] = []
        for offset, raw in damaged.lines(data):
            try:
                entry = json.loads(raw)
                number, usage = int(entry["line"]), Usage.from_dict(entry["usage"])
                day, purpose = str(entry["day"]), str(entry["purpose"])
            except damaged.UNREADABLE as exc:  # a line torn by a power cut, or damaged: it alone is lost
                unreadable.append(damaged.DamagedLine(offset, raw, damaged.describe(exc)))
                continue
            if number > folded:
                days.setdefault(day, _Day()).add(usage, purpose)
            last = max(last, number)
        # Kept aside before the next flush empties the journal.
        damaged.keep_aside(self._journal, unreadable, event="usage_journal_lines_set_aside")
        return days, last

    async def _write(self, days: dict[str, _Day]) -> None:
        for old in sorted(days)[: max(0, len(days) - self._keep_days)]:
            del days[old]
        text = json.dumps(
            {
                "version": LEDGER_VERSION,
                "journal": self._line,  # the journal's lines up to this one are counted here
                "days": {k: v.to_dict() for k, v in sorted(days.items())},
            },
            indent=1,
        )
        # After every line queued before (a barrier): they are in ``text``, so the journal can be emptied.
        await self._writer.call(functools.partial(self._fold, text))
        self._dirty = False

    def _fold(self, text: str) -> None:
        atomic_write_text(self._path, text)
        with contextlib.suppress(FileNotFoundError):  # lines a lost truncation keeps are not read again
            os.truncate(self._journal, 0)


async def record_usage(session: Session, usage: Usage, ledger: UsageLedger | None) -> None:
    """Add a turn's usage to the session's totals and, when given, to today's ledger.

    Called once per turn after the model calls (the usage pipeline system does it); the session's
    figures are saved with the session by the dispatcher. The composition root passes no ledger when
    the LLM client already reports every call to it (that would count chat calls twice).
    """
    session.usage.add(usage)
    if ledger is not None:
        await ledger.add(usage)
