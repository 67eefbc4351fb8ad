"""The ``# Memory`` section of a turn's prompt, fitted to its token budget.

MEMORY.md comes first (in chat scope also the chat's own), then the relevant pack (relevant.py), then
today's notes and, when the pack found nothing, the recent context (recent.py); prompt.py renders them.
What the last section of each chat held is kept for ``/status``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

from bot.config import MemorySettings
from bot.memory.longterm import LongTermMemory
from bot.memory.pack import MemoryPack, PackDiagnostics
from bot.memory.prompt import (
    READING_NOTE,
    chat_memory_section,
    long_term_section,
    now_line,
    recent_section,
    render_memory,
    today_section,
)
from bot.memory.recall import Recaller
from bot.memory.recent import RecentNotes
from bot.memory.relevant import RelevantMemory
from bot.memory.scope import ChatFolders
from bot.memory.timehints import periods

RECALLS_KEPT = 1024  # sessions whose last retrieval /status can report


@dataclass(slots=True)
class MemoryContext:
    text: str
    pack: MemoryPack
    diagnostics: dict[str, object] = field(default_factory=dict)
    tokens: int = 0  # the section's tokens, summed part by part (a little above a count of the whole)


class MemorySection:
    """Builds the ``# Memory`` section (:meth:`build`) and remembers what it last held per chat."""

    def __init__(
        self,
        settings: MemorySettings,
        longterm: LongTermMemory,
        chats: ChatFolders,
        relevant: RelevantMemory,
        recent: RecentNotes,
        recaller: Recaller,
        *,
        tz: ZoneInfo,
        clock: Callable[[], datetime],
        chat_scope: bool,
    ) -> None:
        self._settings = settings
        self._longterm = longterm
        self._chats = chats
        self._relevant = relevant
        self._recent = recent
        self._recaller = recaller
        self._tz = tz
        self._clock = clock
        self._chat_scope = chat_scope
        # What the last memory pack of each session held (for /status); bounded, newest last.
        self._recalls: OrderedDict[str, dict[str, object]] = OrderedDict()

    def last_recall(self, session_id: str) -> dict[str, object] | None:
        """What the last ``# Memory`` built for ``session_id`` in this process retrieved, if any."""
        found = self._recalls.get(session_id)
        if found is None:
            return None
        pack = found.get("pack")
        return {**found, "pack": pack.to_dict()} if isinstance(pack, PackDiagnostics) else found

    def _remember_recall(self, session_id: str, diagnostics: dict[str, object]) -> None:
        self._recalls[session_id] = diagnostics
        self._recalls.move_to_end(session_id)
        while len(self._recalls) > RECALLS_KEPT:
            self._recalls.popitem(last=False)

    async def build(
        self,
        query: str,
        *,
        session_id: str = "",
        now: datetime | None = None,
        shown: Collection[str] = (),
        budget: int | None = None,
        askers: Mapping[str, str] | None = None,
    ) -> MemoryContext:
        """The ``# Memory`` section for a turn of ``session_id`` whose user wrote ``query``.

        ``now`` is the turn's own time (its message's date), so "today" and recency follow the
        conversation, not the clock of the machine. ``shown`` are the ids of the messages in the active
        session: the model sees them already, so memory never repeats them. ``budget`` caps the
        section's tokens (the context-budget service sets it from the model's window); without it the
        configured caps apply. ``askers`` are the turn's senders in a group (see
        :meth:`RelevantMemory.pack`). MEMORY.md comes first, then the pack, then today's notes.
        In chat scope it holds the operator's MEMORY.md and, of everything else, only this chat's.
        """
        s = self._settings
        now = now or self._clock()
        snap = await self._longterm.read()
        chat = await self._chats.longterm(session_id).read() if self._chat_scope else None
        left = budget if budget is not None else self.default_budget()
        head = now_line(now, self._tz)
        # The same few texts every turn (the headings, the minute's date line, MEMORY.md), counted once:
        # a tokenizer call lets go of the GIL, and under load the loop can wait milliseconds to get it back.
        count = self._recaller.count
        long_term = long_term_section(snap.text, s.inject_max_bytes, max_tokens=left // 2, count=count)
        chat_text = (
            chat_memory_section(chat.text, s.inject_max_bytes, max_tokens=left // 2, count=count)
            if chat is not None
            else ""
        )
        fixed = sum(count(t) + 2 for t in (head, READING_NOTE, long_term, chat_text) if t) + count("# Memory")
        left -= fixed
        notes_cap = max(0, min(s.notes_max_tokens, left // 4))
        skip = {(session_id, mid) for mid in shown}
        pack = MemoryPack("", [], PackDiagnostics())
        if query.strip() and left - notes_cap > 0:
            hard = min(s.pack_hard_tokens, left - notes_cap)
            pack = await self._relevant.pack(
                query,
                soft=min(s.pack_soft_tokens, hard),
                hard=hard,
                session_id=session_id,
                now=now,
                skip=skip,
                askers=askers,
            )
        skip |= {m.key for m in pack.memories} | {p.key for m in pack.memories for p in m.previously}
        notes_budget = max(0, min(notes_cap, left - pack.diagnostics.tokens - 8))
        local = now.astimezone(self._tz)
        midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
        today = self._recent.fit(
            self._recent.said_between(midnight, now + timedelta(seconds=1), session_id, skip), notes_budget
        )
        today_lines = [line for _, line in today]
        recent: list[tuple[date, list[str]]] = []
        if not pack.text:
            used = sum(self._recaller.count(line) + 1 for line in today_lines)
            # Nothing matched the words: what was said lately, or in the period the query names
            # ("what did we talk about last Tuesday?" has no word to match).
            named = periods(query, now, self._tz) if query.strip() else []
            start, end = named[0] if named else (midnight - timedelta(days=s.recent_days), midnight)
            earlier = self._recent.said_between(start, min(end, midnight), session_id, skip)
            for memory, line in self._recent.fit(earlier, max(0, notes_budget - used)):
                day = memory.when.astimezone(self._tz).date()
                if not recent or recent[-1][0] != day:
                    recent.append((day, []))
                recent[-1][1].append(line)
        text = render_memory(
            now=head,
            long_term=long_term,
            chat=chat_text,
            pack=pack.text,
            today=today_section(today_lines),
            recent=recent_section(recent),
        )
        tokens = self._parts_tokens(fixed, pack, today_lines, recent) if text else 0
        diagnostics: dict[str, object] = {
            "session_id": session_id,
            "memory_md_bytes": len(snap.text.encode("utf-8")),
            "scope": s.scope,
            # The sum of the parts' counts (each part was counted to fit it): counting the whole section
            # again would cost a tokenizer pass over ~4,000 tokens every turn for a log field.
            "memory_tokens": tokens,
            "budget": budget,
            "today_notes": len(today_lines),
            "pack": pack.diagnostics,  # a dict when asked for (last_recall): most turns nobody asks
        }
        if chat is not None:
            diagnostics["chat_memory_md_bytes"] = len(chat.text.encode("utf-8"))
        if session_id and query.strip():
            self._remember_recall(session_id, diagnostics)
        return MemoryContext(text, pack, diagnostics, tokens)

    def _parts_tokens(
        self, fixed: int, pack: MemoryPack, today: Sequence[str], recent: Sequence[tuple[date, list[str]]]
    ) -> int:
        lines = [*today, *(line for _, day in recent for line in day)]
        sections = 8 * (bool(today) + len(recent))  # headings
        return (
            fixed + pack.diagnostics.tokens + sum(self._recaller.count(line) + 1 for line in lines) + sections
        )

    def default_budget(self) -> int:
        """The memory section's tokens when no window constrains it: the configured caps added up."""
        s = self._settings
        files = s.inject_max_bytes // 3 * (2 if self._chat_scope else 1)
        return files + s.pack_hard_tokens + s.notes_max_tokens + 64
