"""MemoryService: the one object the rest of membot talks to about memory.

It owns the parts under ``memory/`` (MEMORY.md, daily notes, HISTORY, the transcript archive, the
item layers) and offers three paths:

1. write — :meth:`record_exchanges` after each answered turn (notes + heuristic items) and on import;
2. retire — :meth:`retire` archives messages that leave a session and consolidates them in the
   background; :meth:`consolidate` does the same awaited, for compaction and ``/new``;
3. read — :meth:`context` builds the ``# Memory`` prompt section, :meth:`search` ranks items.

With ``memory.scope = "chat"`` every path takes the session id and stays inside that chat (see
bot/memory/scope.py): notes and the bot-written MEMORY.md live in the chat's folder, and items are
retrieved only from the chat that told them. HISTORY.md and the archive stay workspace-wide.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

import structlog

from bot.config import MemorySettings
from bot.domain import SPEAKER_META, Message, Role, Session, utcnow
from bot.group_writer import GroupWriter
from bot.memory.archive import TranscriptArchive
from bot.memory.consolidation import ConsolidationObserver, ConsolidationResult, Consolidator
from bot.memory.embeddings import Embedder
from bot.memory.extract import Utterance, extract
from bot.memory.history import HistoryLog
from bot.memory.item_store import ItemStore
from bot.memory.items import Layer, MemoryItem, Reference, make_title
from bot.memory.lazy_sync import MARKER, LazySync
from bot.memory.longterm import Limits, LongTermMemory
from bot.memory.notes import DailyNotes, fold, not_yet_in, note_line
from bot.memory.pack import (
    MemoryPack,
    PackDiagnostics,
    TokenCounter,
    assemble,
    estimate_tokens,
    overhead,
    price,
)
from bot.memory.prompt import (
    chat_memory_section,
    long_term_section,
    now_line,
    recent_section,
    render_memory,
    today_section,
)
from bot.memory.recall import Candidate, Memory, Recaller, key_of
from bot.memory.retrieval import Retriever, ScoredItem, asks_about_assistant, diversify
from bot.memory.scope import CHATS_DIR, ChatFolders, belongs_to
from bot.memory.timehints import periods
from bot.memory.vectors import VECTORS_DIR, Feedback, VectorStore
from bot.memory.words import load_lemmas, tokenize
from bot.storage import ensure_private_dir, fix_private_tree, line_bytes

if TYPE_CHECKING:  # bot.llm's client loads httpx; only the type is needed here
    from bot.llm import ChatModel

log = structlog.get_logger(__name__)

RECALLS_KEPT = 1024  # sessions whose last retrieval /status can report
SEMANTIC_CANDIDATES = 100  # items the embedding signal brings in, beyond what the words found
INFORMATIVE_TOKENS = 2  # a note line says something: "thanks a lot!" and "ok, great" stay out
INFORMATIVE_HEAD = 200  # characters of a message that decide that, nearly always
ACKNOWLEDGEMENTS = "thanks thank ok okay great cool sure sound good nice perfect awesome yes lot"
NOTE_USER_CHARS = 300
NOTE_ASSISTANT_CHARS = 200
CONVERSATION_KEY = "conversation"  # session.metadata: the conversation going on (set by MemoryPersist)
MessageKey = tuple[str, str]

Clock = Callable[[], datetime]


@dataclass(frozen=True, slots=True)
class Exchange:
    """One answered turn to remember: the user's message and the reply, with where they came from.

    ``user_turn`` / ``assistant_turn`` are positions in the source conversation (imports), so that
    every item can be traced back to its turn; ``conversation`` names the stretch of the chat it belongs
    to (``""``: the session is one conversation), which retrieval ranks as a unit.
    """

    session_id: str
    user: Message | None
    assistant: Message | None
    user_turn: int | None = None
    assistant_turn: int | None = None
    conversation: str = ""


@dataclass(slots=True)
class MemoryContext:
    text: str
    pack: MemoryPack
    diagnostics: dict[str, object] = field(default_factory=dict)
    tokens: int = 0  # the section's tokens, summed part by part (a little above a count of the whole)


class MemoryService:
    """The memory facade. Build it in bot/app.py, ``await start()``, and ``await close()`` on shutdown."""

    def __init__(
        self,
        root: Path,
        settings: MemorySettings,
        *,
        timezone: str = "UTC",
        llm: ChatModel | None = None,
        consolidation_model: str | None = None,
        clock: Clock = utcnow,
        count_tokens: TokenCounter = estimate_tokens,
        embedder: Embedder | None = None,
        maintain_every: timedelta | None = None,
        observer: ConsolidationObserver | None = None,
        consolidation_room: int | None = None,
    ) -> None:
        """``maintain_every`` is for the running bot: it then promotes, decays and compacts items after
        every consolidation and at least that often while it answers. Operator commands and the bench
        leave it ``None``, so that they never rewrite item logs behind the bot's back. ``observer``
        (``bot.metrics.Metrics``) is told about every consolidation. ``consolidation_room``: the prompt
        tokens the consolidation model's window takes (None: not checked).
        """
        self.settings = settings
        self.root = root
        self.tz = ZoneInfo(settings.timezone or timezone)
        self._clock = clock
        limits = Limits.of(settings)
        self.longterm = LongTermMemory(root / "MEMORY.md", limits=limits)
        self.notes = DailyNotes(root, self.tz)
        self.chat_scope = settings.scope == "chat"
        self.chats = ChatFolders(root / CHATS_DIR, self.tz, limits=limits)
        self.history = HistoryLog(root)
        self.archive = TranscriptArchive(root / "archive")
        self.items = ItemStore(root / "items", per_chat=self.chat_scope)
        self.retriever = Retriever(self.items)
        self.recaller = Recaller(self.items, count_tokens, max_message_tokens=settings.max_message_tokens)
        self.vectors = VectorStore(root / VECTORS_DIR, embedder) if embedder is not None else None
        if self.vectors is not None:
            self.items.subscribe(self._embed_later)
        self.consolidator = Consolidator(
            llm,
            self.longterm,
            self.history,
            tz=self.tz,
            clock=clock,
            max_memory_size=settings.max_memory_size,
            max_fact_chars=settings.max_fact_chars,
            model=consolidation_model,
            observer=observer,
            max_prompt_tokens=consolidation_room,
            count=count_tokens,
        )
        self._tasks: set[asyncio.Task[ConsolidationResult]] = set()
        self._notes_writer = GroupWriter("notes-writer")
        self._lazy = LazySync(root / MARKER, self._flush)
        self.unsynced_since: datetime | None = None  # a previous run's writes may be lost since (recover)
        self._maintain_every = maintain_every
        self._maintained_at: datetime | None = None
        # What the last memory pack of each session held (for /status); bounded, newest last.
        self._recalls: OrderedDict[str, dict[str, object]] = OrderedDict()

    def now(self) -> datetime:
        return self._clock()

    def longterm_for(self, session_id: str) -> LongTermMemory:
        """The MEMORY.md the bot writes for ``session_id``: the chat's own one in chat scope."""
        return self.chats.longterm(session_id) if self.chat_scope else self.longterm

    def notes_for(self, session_id: str) -> DailyNotes:
        return self.chats.notes(session_id) if self.chat_scope else self.notes

    def visible(self, item: MemoryItem, session_id: str | None) -> bool:
        """Whether ``session_id`` may see ``item``; ``None`` is the operator, who sees everything."""
        return not self.chat_scope or session_id is None or belongs_to(item, session_id)

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create ``memory/`` (0700), tighten file modes to 0600, and load the item layers."""
        fixed = await asyncio.to_thread(self._prepare)
        if fixed:
            log.warning("memory_permissions_fixed", count=fixed, root=str(self.root))
        self.unsynced_since = await asyncio.to_thread(self._lazy.left_by_last_run)
        await self.items.load()
        if self.chat_scope and (split := await self.items.separate_chats()):
            # Merged across chats by an earlier version (or while the scope was "workspace").
            log.warning("memory_items_separated_by_chat", count=split)
        await asyncio.to_thread(load_lemmas)
        await self.retriever.ready()
        if self.vectors is not None:
            await self.vectors.start()
            # What has no vector yet (a new model, items imported beside the bot) is embedded in the
            # background; the bot answers meanwhile with what it has.
            self.vectors.submit(i for i in self.items.items() if embeddable(i))

    def _prepare(self) -> int:
        for folder in (
            self.root,
            self.root / "archive",
            self.root / "items",
            self.root / "items" / "episodic",
            *([self.chats.root] if self.chat_scope else []),
        ):
            ensure_private_dir(folder)
        return fix_private_tree(self.root)

    async def close(self) -> None:
        """Wait for background consolidations (each has its own deadline, so this ends); the running
        bot also writes which items were recalled since the last maintenance."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.vectors is not None:
            await self.vectors.close()
        await asyncio.gather(self.items.drain(), self._notes_writer.drain())
        await self._lazy.close()
        # The next start reads these two instead of parsing and re-tokenizing every item.
        await self.items.save_snapshot()
        await self.retriever.save()
        if self._maintain_every is not None:
            try:
                await self.items.flush_touches()
            except OSError as exc:
                log.error("memory_touches_not_saved", error=repr(exc))

    # -- write path -------------------------------------------------------------------------------

    async def record_exchanges(
        self, exchanges: Sequence[Exchange], *, replay: bool = False, sync: bool = True
    ) -> list[MemoryItem]:
        """Daily-note lines and heuristic items for answered turns (batched: one write per file).

        ``replay`` (imports) skips note lines already written, so an interrupted import can be run
        again; items need no such care, since a repeated item merges by fingerprint. ``sync=False``
        (the running bot, whose sessions hold the messages durably): written now, fsynced within a
        second (see lazy_sync.py).
        """
        note_lines: dict[Path, list[str]] = {}
        utterances: list[Utterance] = []
        for ex in exchanges:
            if ex.user is not None and ex.assistant is not None:
                notes = self.notes_for(ex.session_id)
                # The exchange happened when the user wrote; a date in the future (a platform's or a
                # sender's clock) is filed under today, not under a day no note has reached yet.
                when = notes.local(min(ex.user.timestamp, self.now()))
                line = note_line(when, ex.user.content, ex.assistant.content)
                note_lines.setdefault(notes.path_for(when.date()), []).append(line)
            for msg, turn in ((ex.user, ex.user_turn), (ex.assistant, ex.assistant_turn)):
                if msg is not None and msg.content.strip():
                    ref = Reference(ex.session_id, msg.id, turn, conversation=ex.conversation)
                    utterances.append(
                        Utterance(msg.role.value, msg.content, msg.timestamp, ref, *_speaker(msg))
                    )
        # The notes and the items are separate files: their writes (and fsyncs) go on side by side.
        async with contextlib.nullcontext() if sync else self._lazy.writing():
            stored, _ = await asyncio.gather(
                self.items.add_many(extract(utterances), sync=sync),
                self._append_notes(note_lines, replay=replay, sync=sync),
            )
        await self._promote(stored)
        await self._maintain(when_due=True)
        return stored

    async def _append_notes(self, note_lines: dict[Path, list[str]], *, replay: bool, sync: bool) -> None:
        for path, lines in note_lines.items():
            if replay:
                lines = await asyncio.to_thread(not_yet_in, path, lines)
            if lines:
                await self._notes_writer.append(path, line_bytes("\n".join(lines)), sync=sync)

    async def _flush(self) -> None:
        """fsync what :meth:`record_exchanges` wrote with ``sync=False`` (for :class:`LazySync`)."""
        await asyncio.gather(self.items.sync(), self._notes_writer.sync())

    async def recover(self, session: Session) -> int:
        """Record again the messages of ``session`` that have no items: a power cut lost them before
        their fsync (see lazy_sync.py). Returns how many; note lines already written are not repeated."""
        # Every message is looked at, not only the newest: one message's items may go to another day's
        # file than the next one's, and a power cut may keep either. A session holds few (it is trimmed
        # past ``memory_window``, after a sync), and a deleted item still counts as its message's.
        missing = [
            m
            for m in session.messages
            if m.role in (Role.USER, Role.ASSISTANT)
            and m.content.strip()
            and not m.tool_calls  # a step of the tool loop, not an answer (never recorded)
            and not self.items.of_message((session.id, m.id))
        ]
        talk = session.metadata.get(CONVERSATION_KEY)
        talk = talk if isinstance(talk, str) else ""
        exchanges: list[Exchange] = []
        users: list[Message] = []
        for message in missing:
            if message.role is Role.USER:
                users.append(message)
                continue
            asked: list[Message | None] = [*users] or [None]
            exchanges += [Exchange(session.id, u, None, conversation=talk) for u in asked[:-1]]
            exchanges.append(Exchange(session.id, asked[-1], message, conversation=talk))
            users = []
        exchanges += [Exchange(session.id, u, None, conversation=talk) for u in users]
        if exchanges:
            await self.record_exchanges(exchanges, replay=True)
        return len(missing)

    async def recovered(self) -> None:
        """Every session was checked (:meth:`recover`): the marker a previous run left can go."""
        await self._lazy.recovered()
        self.unsynced_since = None

    async def _promote(self, candidates: Sequence[MemoryItem]) -> None:
        """Promote what was just written, if confident enough (never a scan of every item)."""
        await self.items.promote(self.now(), self.settings.promotion_confidence, candidates)

    async def maintain(self) -> dict[str, int]:
        """Promotion, decay and log compaction: in-memory scans plus a write only for what changed."""
        now = self.now()
        await self.items.flush_touches()
        promoted = await self.items.promote(now, self.settings.promotion_confidence)
        decayed = await self.items.decay(now, self.settings.decay_days)
        compacted = await self.items.compact()
        await self.items.save_snapshot()
        await self.retriever.save()
        return {"promoted": len(promoted), "decayed": decayed, "compacted": compacted}

    async def _maintain(self, *, when_due: bool = False) -> None:
        """:meth:`maintain` for the running bot only (``maintain_every`` set); ``when_due`` waits for
        ``maintain_every`` since the last run. A failure is logged, never the user's problem."""
        every, last = self._maintain_every, self._maintained_at
        if every is None or (when_due and last is not None and self.now() - last < every):
            return
        self._maintained_at = self.now()
        try:
            report = await self.maintain()
        except OSError as exc:
            log.error("memory_maintenance_failed", error=repr(exc))
            return
        if any(report.values()):
            log.info("memory_maintained", **report)

    # -- retire path ------------------------------------------------------------------------------

    async def archive_messages(self, session_id: str, messages: Sequence[Message]) -> int:
        """Keep ``messages`` in the archive before they leave the session; what was recorded of them
        without an fsync is synced first (the next start can only record again what a session holds)."""
        if self._lazy.pending:
            await self._lazy.sync()
        return await self.archive.append(session_id, messages, self.now())

    async def consolidate(
        self,
        session: Session | str,
        messages_to_retire: Sequence[Message],
        *,
        timeout: float | None = None,
    ) -> ConsolidationResult:
        """Archive, then consolidate ``messages_to_retire`` into HISTORY/MEMORY.md; awaited.

        In chat scope the MEMORY.md is the chat's own (:meth:`longterm_for`), never the operator's.

        Used by compaction and ``/new``. On timeout or failure a raw-fallback entry is written and
        ``result.raw_fallback`` is True; the caller may drop the messages from the session either way.
        """
        session_id = session if isinstance(session, str) else session.id
        archived = await self.archive_messages(session_id, messages_to_retire)
        wait = self.settings.consolidation_timeout if timeout is None else timeout
        result = await self.consolidator.run(
            session_id, messages_to_retire, timeout=wait, longterm=self.longterm_for(session_id)
        )
        result.archived = archived
        await self._store_facts(session_id, messages_to_retire, result)
        await self._maintain()
        return result

    def consolidate_in_background(
        self, session_id: str, messages_to_retire: Sequence[Message]
    ) -> asyncio.Task[ConsolidationResult]:
        """Start :meth:`consolidate` without waiting; :meth:`close` waits for it."""
        task = asyncio.create_task(
            self.consolidate(session_id, list(messages_to_retire)), name=f"consolidate:{session_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[ConsolidationResult]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("consolidation_crashed", error=repr(task.exception()))

    @property
    def pending_consolidations(self) -> int:
        return len(self._tasks)

    async def _store_facts(
        self, session_id: str, messages: Sequence[Message], result: ConsolidationResult
    ) -> None:
        if not result.facts:
            return
        now = self.now()
        refs = tuple(Reference(session_id, m.id) for m in messages if m.role is Role.USER)[:20]
        items = [
            MemoryItem(
                layer=Layer.EPISODIC,
                type=fact.type,
                title=make_title(fact.content),
                content=fact.content,
                source="consolidation",
                confidence=fact.confidence,
                salience=0.75,
                created_at=now,
                updated_at=now,
                last_accessed_at=now,
                references=refs or (Reference(session_id),),
            )
            for fact in result.facts
        ]
        await self._promote(await self.items.add_many(items))

    # -- read path --------------------------------------------------------------------------------

    async def search(
        self,
        query: str,
        *,
        k: int = 10,
        layers: Sequence[Layer] | None = None,
        touch: bool = False,
        session_id: str | None = None,
    ) -> list[ScoredItem]:
        """The ``k`` best items for ``query`` (one per source message), best first.

        In chat scope only ``session_id``'s items are searched; ``None`` (the operator) searches all.
        """
        ranked = await self._rank(query, session_id)
        if layers is not None:
            ranked = [s for s in ranked if s.item.layer in layers]
        out = list(diversify(ranked))[:k]
        if touch:
            await self._touch(out)
        return out

    def prefetch(self, query: str) -> None:
        """Start the work for ``query`` that can go ahead of its turn (the query's vector), without
        waiting for it. A turn that then asks for the same text finds it made or in the making."""
        if self.vectors is not None:
            self.vectors.prefetch(query)

    async def _rank(
        self, query: str, session_id: str | None, now: datetime | None = None, *, asker: str = ""
    ) -> list[ScoredItem]:
        await self.retriever.ready()
        # In chat scope a chat sees its own items; "" (no chat) sees none, None (the operator) all.
        visible = None
        own: AbstractSet[str] | None = None  # the ids candidates are drawn from, when not all
        if self.chat_scope and session_id is not None:
            chat = session_id
            visible = lambda i: belongs_to(i, chat)  # noqa: E731
            mine = self.items.of_session(chat)
            if len(mine) * 2 < len(self.items):  # others' items are the many: they must not crowd out
                own = mine  # this chat's (the rest of the time, filtering the best of all is cheaper)
        now = now or self.now()
        if self.vectors is not None:
            self.vectors.prefetch(query)  # the model starts on the query in its thread, as words count
            await asyncio.sleep(0)  # (its task hands the text to the model's thread)
        matched = self.retriever.match_words(query, now, visible=visible, tz=self.tz, only=own, asker=asker)
        similarities = await self._similarities(query, visible, own) if self.vectors is not None else None
        return self.retriever.rank(
            query, now, visible=visible, similarities=similarities, tz=self.tz, matched=matched
        )

    def _embed_later(self, old: MemoryItem | None, new: MemoryItem | None) -> None:
        """Every new or changed item is queued for its vector (the store skips what it has)."""
        if self.vectors is not None and new is not None and embeddable(new):
            self.vectors.submit([new])

    async def _similarities(
        self, query: str, visible: Callable[[MemoryItem], bool] | None, own: AbstractSet[str] | None
    ) -> dict[str, float]:
        """Cosine similarity of the query with the items nearest to it in meaning (among ``own``'s, when
        given), by item id."""
        assert self.vectors is not None
        usable = None
        if visible is not None:
            usable = lambda f: any(visible(i) for i in self.items.with_fingerprint(f))  # noqa: E731
        feedback = Feedback(usable=usable)
        among = None
        if own is not None:
            among = {item.fingerprint for i in own if (item := self.items.get(i)) is not None}
        out: dict[str, float] = {}
        nearest = await self.vectors.nearest(query, SEMANTIC_CANDIDATES, among, feedback=feedback)
        for fingerprint, score in nearest:
            for item in self.items.with_fingerprint(fingerprint):
                if visible is None or visible(item):
                    out[item.id] = score
        return out

    async def _touch(self, chosen: Sequence[ScoredItem]) -> None:
        """Remember use in memory only; the next write of the item persists it (no write per query)."""
        now = self.now()
        for scored in chosen:
            self.items.touch(scored.item.id, now)

    async def pack(
        self,
        query: str,
        *,
        soft: int | None = None,
        hard: int | None = None,
        session_id: str | None = None,
        now: datetime | None = None,
        skip: Collection[MessageKey] = (),
        asker: str = "",
    ) -> MemoryPack:
        """The ``## Relevant Memory`` section for ``query``: the most relevant memories that fit the budget,
        leaving out the messages in ``skip`` (those the prompt already shows). ``asker``: in a group, the
        sender's id, whose own statements a question about "my job" means."""
        s = self.settings
        started = time.perf_counter()
        hard = s.pack_hard_tokens if hard is None else hard
        soft = min(hard, s.pack_soft_tokens if soft is None else soft)
        base = overhead(self.recaller.count)
        ranked = await self._rank(query, session_id, now, asker=asker)
        memories, skipped = self.recaller.gather(ranked, skip=set(skip))
        recall = self.recaller.select(
            memories,
            soft=max(0, soft - base),
            hard=max(0, hard - base),
            floor=s.recall_floor,
            cost=lambda m: price(m, self.recaller.count, self.tz),
            brief_assistant=not asks_about_assistant(query),
            restates=lambda item: self.retriever.restates(item, query),
        )
        recall.diagnostics.skipped_shown = skipped
        pack = assemble(recall, hard=hard, count=self.recaller.count, tz=self.tz, query=query)
        pack.diagnostics.soft_budget = soft
        pack.diagnostics.embeddings = self.vectors is not None
        await self._touch(pack.items)
        pack.diagnostics.ms = round((time.perf_counter() - started) * 1000, 2)
        return pack

    def _said_between(
        self, start: datetime, end: datetime, session_id: str, skip: set[MessageKey]
    ) -> Iterator[Candidate]:
        """What was said in ``[start, end)`` that the prompt does not show yet, one candidate per
        message, newest first and lazily: notes need the last few, however busy the day was."""
        pending: dict[MessageKey, list[ScoredItem]] = {}
        at: datetime | None = None
        own = session_id if self.chat_scope and session_id else None  # chat scope: only this chat's
        for item in self.items.newest_between(start, end, session_id=own):
            if item.source in ("tool", "consolidation") or not self.visible(item, session_id):
                continue
            if at is not None and item.created_at < at:  # every item of a message shares its time
                yield from (Candidate(key, tuple(hits)) for key, hits in pending.items())
                pending.clear()
            at = item.created_at
            key = key_of(item)
            if key not in skip:
                pending.setdefault(key, []).append(ScoredItem(item, 0.0, 0.0))
        yield from (Candidate(key, tuple(hits)) for key, hits in pending.items())

    def _fit_notes(self, newest_first: Iterable[Candidate], budget: int) -> list[tuple[Memory, str]]:
        """The newest informative messages (not "thanks!") whose note lines fit ``budget`` tokens,
        oldest first, each with its note line."""
        chosen: list[tuple[Memory, str]] = []
        used = 0
        for candidate in newest_first:
            memory = self.recaller.realize(candidate)
            if not informative(memory.text):
                continue
            line = note_of(memory, self.tz)
            cost = self.recaller.count(line) + 1
            if used + cost > budget:
                break
            chosen.append((memory, line))
            used += cost
        return sorted(chosen, key=lambda chosen: (chosen[0].when, chosen[0].key))

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

    async def context(
        self,
        query: str,
        *,
        session_id: str = "",
        now: datetime | None = None,
        shown: Collection[str] = (),
        budget: int | None = None,
        asker: str = "",
    ) -> MemoryContext:
        """The ``# Memory`` section for a turn of ``session_id`` whose user wrote ``query``.

        ``now`` is the turn's own time (its message's date), so "today" and recency follow the
        conversation, not the clock of the machine. ``shown`` are the ids of the messages in the active
        session: the model sees them already, so memory never repeats them. ``budget`` caps the
        section's tokens (the context-budget service sets it from the model's window); without it the
        configured caps apply. ``asker`` is the sender's id in a group (see :meth:`pack`). MEMORY.md comes
        first, then the pack, then today's notes.
        In chat scope it holds the operator's MEMORY.md and, of everything else, only this chat's.
        """
        s = self.settings
        now = now or self.now()
        snap = await self.longterm.read()
        chat = await self.chats.longterm(session_id).read() if self.chat_scope else None
        left = budget if budget is not None else self.default_budget()
        head = now_line(now, self.tz)
        # The same few texts every turn (the headings, the minute's date line, MEMORY.md), counted once:
        # a tokenizer call lets go of the GIL, and under load the loop can wait milliseconds to get it back.
        count = self.recaller.count
        long_term = long_term_section(snap.text, s.inject_max_bytes, max_tokens=left // 2, count=count)
        chat_text = (
            chat_memory_section(chat.text, s.inject_max_bytes, max_tokens=left // 2, count=count)
            if chat is not None
            else ""
        )
        fixed = sum(count(t) + 2 for t in (head, long_term, chat_text) if t) + count("# Memory")
        left -= fixed
        notes_cap = max(0, min(s.notes_max_tokens, left // 4))
        skip = {(session_id, mid) for mid in shown}
        pack = MemoryPack("", [], PackDiagnostics())
        if query.strip() and left - notes_cap > 0:
            hard = min(s.pack_hard_tokens, left - notes_cap)
            pack = await self.pack(query, soft=min(s.pack_soft_tokens, hard), hard=hard,
                                   session_id=session_id, now=now, skip=skip, asker=asker)  # fmt: skip
        skip |= {m.key for m in pack.memories} | {p.key for m in pack.memories for p in m.previously}
        notes_budget = max(0, min(notes_cap, left - pack.diagnostics.tokens - 8))
        local = now.astimezone(self.tz)
        midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
        today = self._fit_notes(
            self._said_between(midnight, now + timedelta(seconds=1), session_id, skip), notes_budget
        )
        today_lines = [line for _, line in today]
        recent: list[tuple[date, list[str]]] = []
        if not pack.text:
            used = sum(self.recaller.count(line) + 1 for line in today_lines)
            # Nothing matched the words: what was said lately, or in the period the query names
            # ("what did we talk about last Tuesday?" has no word to match).
            named = periods(query, now, self.tz) if query.strip() else []
            start, end = named[0] if named else (midnight - timedelta(days=s.recent_days), midnight)
            earlier = self._said_between(start, min(end, midnight), session_id, skip)
            for memory, line in self._fit_notes(earlier, max(0, notes_budget - used)):
                day = memory.when.astimezone(self.tz).date()
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
            fixed + pack.diagnostics.tokens + sum(self.recaller.count(line) + 1 for line in lines) + sections
        )

    def default_budget(self) -> int:
        """The memory section's tokens when no window constrains it: the configured caps added up."""
        s = self.settings
        files = s.inject_max_bytes // 3 * (2 if self.chat_scope else 1)
        return files + s.pack_hard_tokens + s.notes_max_tokens + 64


def embeddable(item: MemoryItem) -> bool:
    """Whether an item gets a vector: what the user said and the facts, not the assistant's answers.

    Meaning search is for finding the user's own words worded differently; an answer is still found by
    its words and comes along with the user turn before it (context expansion). Embedding answers cost
    half the model's time (long ones ~10x a user message) and, on the open LongMemEval subset, bought
    nothing: without them evidence reach went 0.977 -> 0.983 and turn recall_all@10 0.831 -> 0.843."""
    return "assistant" not in item.tags


@functools.cache
def _acknowledgements() -> frozenset[str]:
    return frozenset(tokenize(ACKNOWLEDGEMENTS))


def _speaker(message: Message) -> tuple[str, str]:
    """Who said a group message: the name its text starts with, and their id (see bot/intake.py's
    ``user_message``); empty in a private chat."""
    name = message.meta.get(SPEAKER_META)
    if not isinstance(name, str) or not name or not message.content.startswith(f"{name}: "):
        return "", ""
    return name, str(message.meta.get("sender_id") or "")


def informative(text: str) -> bool:
    """Whether a message says something beyond "thanks, great!" (worth a note line).

    Today's notes ask it of the day's newest messages on every turn: its start decides for nearly any
    message, and that answer is remembered."""
    head = text[:INFORMATIVE_HEAD]
    return _informative(head) or (len(text) > len(head) and _informative(text))


@functools.lru_cache(maxsize=4096)
def _informative(text: str) -> bool:
    return sum(1 for t in tokenize(text) if t not in _acknowledgements()) >= INFORMATIVE_TOKENS


def note_of(memory: Memory, tz: ZoneInfo) -> str:
    """One line of today's notes: the time, who, and the message folded to a line."""
    who = "assistant" if memory.role == "assistant" else ("user (asked)" if memory.question else "user")
    limit = NOTE_ASSISTANT_CHARS if memory.role == "assistant" else NOTE_USER_CHARS
    return f"- [{memory.when.astimezone(tz):%H:%M}] {who}: {fold(memory.text, limit)}"
