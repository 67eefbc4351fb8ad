"""Pending consolidations: retired messages whose HISTORY entry and facts are not all written yet.

A retirement records its messages here (``memory/pending/<id>.json``, written atomically) before they
reach the archive, and the record goes once the consolidation's results are written. A kill in between
(a background consolidation runs after the session was saved without its messages) leaves the record,
and the next start of the running bot resumes the work (:meth:`Retirement.resume
<bot.memory.retirement.Retirement.resume>`). What the model decided is added to the record before any
of it is written (a :class:`Plan`), so a resumed consolidation writes only what is missing of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from bot import damaged
from bot.domain import Message, new_id, parse_time
from bot.memory.items import ItemType
from bot.storage import atomic_write_bytes, fsync_dir
from bot.surrogates import utf8

log = structlog.get_logger(__name__)

PENDING_DIR = "pending"  # under memory/: one record a retirement not consolidated yet


@dataclass(frozen=True, slots=True)
class DurableFact:
    """A fact the model found worth keeping, stored as an episodic item beside what was said."""

    type: ItemType
    content: str
    confidence: float


@dataclass(frozen=True, slots=True)
class Plan:
    """What a consolidation writes, decided before any of it is written.

    It is kept with the retirement's pending record, so a start after a kill writes what is missing of
    it instead of asking the model again: a HISTORY entry, a MEMORY.md change or a fact is never
    written twice. ``base`` is MEMORY.md as the model read it (None: MEMORY.md is
    left alone); ``when`` is the local time of the HISTORY heading; a ``reason`` makes it a raw fallback.
    ``history_written`` and ``memory_written`` are journaled once the HISTORY entry and MEMORY.md are
    written: a resume must not write them again over what the operator edited while the bot was down.
    """

    when: datetime
    entry: str
    base: str | None = None
    memory: str = ""
    facts: tuple[DurableFact, ...] = ()
    parse_tier: int = 0
    reason: str = ""
    history_written: bool = False
    memory_written: bool = False

    def to_dict(self) -> dict[str, Any]:
        facts = [{"type": f.type.value, "content": f.content, "confidence": f.confidence} for f in self.facts]
        return {
            "when": self.when.isoformat(),
            "entry": self.entry,
            "base": self.base,
            "memory": self.memory,
            "facts": facts,
            "parse_tier": self.parse_tier,
            "reason": self.reason,
            "history_written": self.history_written,
            "memory_written": self.memory_written,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        base = data.get("base")
        return cls(
            when=parse_time(str(data["when"])),
            entry=str(data.get("entry") or ""),
            base=None if base is None else str(base),
            memory=str(data.get("memory") or ""),
            facts=tuple(
                DurableFact(ItemType(f["type"]), str(f["content"]), float(f["confidence"]))
                for f in data.get("facts") or ()
            ),
            parse_tier=int(data.get("parse_tier") or 0),
            reason=str(data.get("reason") or ""),
            history_written=bool(data.get("history_written")),
            memory_written=bool(data.get("memory_written")),
        )


Journal = Callable[[Plan], Awaitable[None]]


@dataclass(slots=True)
class PendingWork:
    """One retirement's messages, and what the model decided for them once it has."""

    id: str
    session_id: str
    messages: list[Message]
    plan: Plan | None = None
    archived: int = 0  # messages this process added to the archive for it (not kept in the file)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "session_id": self.session_id,
            "messages": [m.to_dict() for m in self.messages],
            "plan": None if self.plan is None else self.plan.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PendingWork:
        plan = data.get("plan")
        return cls(
            str(data["id"]),
            str(data["session_id"]),
            [Message.from_dict(m) for m in data["messages"]],
            None if plan is None else Plan.from_dict(plan),
        )


class PendingConsolidations:
    """The folder of pending records; each one is written whole (temp file, fsync, rename) or not at all."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory

    async def add(self, session_id: str, messages: Sequence[Message], now: datetime) -> PendingWork:
        """Record ``messages`` as retiring; the id starts with ``now``, so records resume in order.

        An older record holding any of them is an orphan: their archive append never happened (the
        archive would hold them, and they would not be retired again), and this record consolidates
        them now. They leave it (it goes when none is left), so no message is consolidated twice."""
        work = PendingWork(f"{now:%Y%m%dT%H%M%S%f}-{new_id()}", session_id, list(messages))
        await self._save(work)
        await asyncio.to_thread(self._supersede, work)
        return work

    async def planned(self, work: PendingWork, plan: Plan) -> None:
        """Keep what the model decided, before any of it is written."""
        work.plan = plan
        await self._save(work)

    async def done(self, work: PendingWork) -> None:
        await asyncio.to_thread(self._remove, self._path(work.id))

    async def load(self) -> list[PendingWork]:
        """The records a previous run left, oldest first; an unreadable one is moved aside (kept for the
        operator as ``<name>.damaged-<hash>``, which no later start reads again) and logged."""
        return await asyncio.to_thread(self._load)

    async def move(self, old: str, new: str) -> int:
        """Give the records of chat ``old`` to chat ``new`` (a Telegram group's move, bot/session_moves.py,
        before they are resumed): their facts and archive go to the chat the group is now; returns how
        many. Each record is rewritten whole, so a repeat after a kill finishes the rest."""
        return await asyncio.to_thread(self._move, old, new)

    def _move(self, old: str, new: str) -> int:
        moved = 0
        for work in self._load():
            if work.session_id == old:
                work.session_id = new
                atomic_write_bytes(self._path(work.id), _encoded(work))
                moved += 1
        return moved

    def _path(self, work_id: str) -> Path:
        return self._dir / f"{work_id}.json"

    async def _save(self, work: PendingWork) -> None:
        await asyncio.to_thread(atomic_write_bytes, self._path(work.id), _encoded(work))

    def _remove(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            fsync_dir(path.parent)

    def _supersede(self, work: PendingWork) -> None:
        taken = {m.id for m in work.messages}
        for older in self._load(leaving_out=self._path(work.id)):  # (not the record just written)
            if older.session_id != work.session_id:
                continue
            left = [m for m in older.messages if m.id not in taken]
            if len(left) == len(older.messages):
                continue
            log.warning("pending_consolidation_superseded", id=older.id, by=work.id, left=len(left))
            if left:
                older.messages = left
                atomic_write_bytes(self._path(older.id), _encoded(older))
            else:
                self._remove(self._path(older.id))

    def _load(self, *, leaving_out: Path | None = None) -> list[PendingWork]:
        if not self._dir.is_dir():
            return []
        found: list[PendingWork] = []
        for path in sorted(self._dir.glob("*.json")):
            if path == leaving_out:
                continue
            raw = path.read_bytes()
            try:
                found.append(PendingWork.from_dict(json.loads(raw)))
            except damaged.UNREADABLE as exc:
                damaged.move_aside(
                    path, raw, event="pending_consolidation_unreadable", error=damaged.describe(exc)
                )
        return found


def _encoded(work: PendingWork) -> bytes:
    return utf8(json.dumps(work.to_dict(), ensure_ascii=False))
