"""MemoryService: the one object the rest of membot talks to about memory.

It owns the parts under ``memory/`` (MEMORY.md, daily notes, HISTORY, the transcript archive, the
item layers), composes the modules that work on them, and offers three paths:

1. write — :meth:`record_exchanges` after each answered turn (notes + heuristic items) and on import
   (recorder.py), then promotion and, for the running bot, maintenance (upkeep.py);
2. retire — :meth:`archive_messages` keeps messages that leave a session, and
   :meth:`consolidate_in_background` also consolidates them; :meth:`consolidate` does both awaited,
   for compaction and ``/new`` (retirement.py). A consolidation a kill cut short is resumed by the
   running bot's :meth:`start`, or its :meth:`resume` after the chats that moved took theirs along
   (pending.py, bot/session_moves.py);
3. read — :meth:`context` builds the ``# Memory`` prompt section (section.py, with recent.py's notes),
   :meth:`search` ranks items and :meth:`pack` packs them (relevant.py). These parts, with the word
   index and the vectors, are reading.py's ReadPath, which a bot with memory off does not build.

With ``memory.scope = "chat"`` every path takes the session id and stays inside that chat (see
bot/memory/scope.py): notes and the bot-written MEMORY.md live in the chat's folder, and items are
retrieved only from the chat that told them. HISTORY.md and the archive stay workspace-wide.

``read_only`` opens memory for a reader beside the running bot, which owns the files (``membot memory
search|show|stats`` take no workspace lock): its start and close change nothing in the workspace (no
folder made, no mode fixed, no damaged line kept aside, no chats' items separated on disk, no snapshot,
index or marker written, no consolidation resumed), and what the bot's start would change it changes
in memory only, so a query is answered as the bot answers it. Given an embedder, it reads that
model's vectors as the bot left them (a read-only VectorStore: nothing embedded, appended, cut or
moved aside), so a query is found by its meaning too; items the bot has not embedded yet are found by
their words only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

import structlog

from bot.config import MemorySettings
from bot.domain import Message, Session, utcnow
from bot.memory.archive import TranscriptArchive
from bot.memory.consolidation import ConsolidationObserver, ConsolidationResult, Consolidator
from bot.memory.history import HistoryLog
from bot.memory.item_store import ItemStore
from bot.memory.items import Layer, MemoryItem, ScoredItem
from bot.memory.lazy_sync import MARKER
from bot.memory.longterm import Limits, LongTermMemory
from bot.memory.memories import MessageKey
from bot.memory.notes import DailyNotes
from bot.memory.opening import open_folder
from bot.memory.pack import MemoryPack, TokenCounter, estimate_tokens
from bot.memory.pending import PENDING_DIR, PendingConsolidations
from bot.memory.recall import Recaller
from bot.memory.recorder import Exchange, Recorder, exchanges_of
from bot.memory.retirement import Retirement
from bot.memory.scope import CHATS_DIR, ChatFolders, may_see
from bot.memory.upkeep import Upkeep

if TYPE_CHECKING:  # bot.llm's client loads httpx, and the read path numpy: only types are needed here
    from bot.llm import ChatModel
    from bot.memory.embeddings import Embedder
    from bot.memory.reading import ReadPath
    from bot.memory.retrieval import Retriever
    from bot.memory.section import MemoryContext
    from bot.memory.vectors import VectorStore

log = structlog.get_logger(__name__)

Clock = Callable[[], datetime]


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
        read_only: bool = False,
        retrieval: bool = True,
    ) -> None:
        """``maintain_every`` is for the running bot: it then promotes, decays and compacts items that
        often, while it answers or consolidates. Operator commands and the bench
        leave it ``None``, so that they never rewrite item logs behind the bot's back. ``observer``
        (``bot.metrics.Metrics``) is told about every consolidation. ``consolidation_room``: the prompt
        tokens the consolidation model's window takes (None: not checked). ``read_only``: see the
        module doc; it takes no ``maintain_every``, its ``embedder`` only embeds queries, and its write
        paths raise. ``retrieval=False`` (the bot with ``memory.enabled = false``): no read path
        (reading.py: no word index, vectors or ``# Memory`` section, and numpy is never loaded); it
        takes no ``embedder``, and :meth:`search`, :meth:`pack` and :meth:`context` raise.
        """
        if read_only and maintain_every is not None:
            raise ValueError("a read-only MemoryService does not maintain")
        if embedder is not None and not retrieval:
            raise ValueError("a MemoryService without retrieval embeds nothing")
        self.read_only = read_only
        self.settings = settings
        self.root = root
        self.tz = tz = ZoneInfo(settings.timezone or timezone)
        self._clock = clock
        limits = Limits.of(settings)
        self.longterm = LongTermMemory(root / "MEMORY.md", limits=limits, read_only=read_only)
        self.notes = DailyNotes(root, tz)
        self.chat_scope = scoped = settings.scope == "chat"
        self.chats = ChatFolders(root / CHATS_DIR, tz, limits=limits, read_only=read_only)
        self.history = HistoryLog(root)
        self.archive = TranscriptArchive(root / "archive")
        self.pending = PendingConsolidations(root / PENDING_DIR)  # retirements a kill cut short
        self.items = ItemStore(root / "items", per_chat=scoped, read_only=read_only)
        self.recaller = Recaller(self.items, count_tokens, max_message_tokens=settings.max_message_tokens)
        self._reading: ReadPath | None = None
        if retrieval:
            # Imported here, the one place it is built: it loads numpy and simplemma (see reading.py).
            from bot.memory.reading import ReadPath

            self._reading = ReadPath(
                root,
                self.items,
                self.recaller,
                self.longterm,
                self.chats,
                settings,
                embedder=embedder,
                tz=tz,
                clock=clock,
                chat_scope=scoped,
                read_only=read_only,
            )
        self.consolidator = Consolidator(
            llm,
            self.longterm,
            self.history,
            tz=tz,
            clock=clock,
            max_memory_size=settings.max_memory_size,
            max_fact_chars=settings.max_fact_chars,
            model=consolidation_model,
            observer=observer,
            max_prompt_tokens=consolidation_room,
            count=count_tokens,
        )
        self._recorder = Recorder(self.items, self.notes_for, marker=root / MARKER, clock=clock)
        index = self._reading.retriever if self._reading is not None else None
        self._upkeep = Upkeep(self.items, index, settings, clock=clock, every=maintain_every)
        self._rewrites_logs = maintain_every is not None  # the running bot
        self._retirement = Retirement(
            self.archive,
            self.consolidator,
            self.items,
            self.pending,
            self._upkeep,
            settings,
            lazy=self._recorder.lazy,
            longterm_for=self.longterm_for,
            clock=clock,
        )
        self.unsynced_since: datetime | None = None  # a previous run's writes may be lost since (recover)

    def now(self) -> datetime:
        return self._clock()

    @property
    def vectors(self) -> VectorStore | None:
        """The items' vectors: None without an embedder (or retrieval)."""
        return self._reading.vectors if self._reading is not None else None

    @property
    def retriever(self) -> Retriever:
        """The ranking (and its word index); raises without retrieval."""
        return self._read().retriever

    def _read(self) -> ReadPath:
        if self._reading is None:
            raise RuntimeError(f"memory under {self.root} was opened without retrieval (memory.enabled)")
        return self._reading

    def longterm_for(self, session_id: str) -> LongTermMemory:
        """The MEMORY.md the bot writes for ``session_id``: the chat's own one in chat scope."""
        return self.chats.longterm(session_id) if self.chat_scope else self.longterm

    def notes_for(self, session_id: str) -> DailyNotes:
        return self.chats.notes(session_id) if self.chat_scope else self.notes

    def visible(self, item: MemoryItem, session_id: str | None) -> bool:
        """Whether ``session_id`` may see ``item``; ``None`` is the operator, who sees everything."""
        return may_see(session_id, item, chat_scope=self.chat_scope)

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self, *, resume: bool = True) -> None:
        """Create ``memory/`` (0700), tighten file modes to 0600 at most, and load the item layers
        (opening.py); the running bot then resumes, in the background, the consolidations a kill cut short
        (``resume=False``: at :meth:`resume`, once the chats that moved took their records along:
        bot/session_moves.py). Read-only: only the loads (see the module doc)."""
        if self.read_only:
            await self._start_read_only()
            return
        self.unsynced_since = await open_folder(
            self.root,
            self.items,
            self.chats,
            self._recorder.lazy,
            self.longterm.path,
            chat_scope=self.chat_scope,
            compact_damaged=self._rewrites_logs,
        )
        if self._reading is not None:
            await self._reading.start(embed_missing=True)
        if resume:
            await self.resume()

    async def resume(self) -> None:
        """Resume, in the background, the consolidations a kill cut short (the running bot only)."""
        if self._rewrites_logs:  # not an operator command: it would consolidate behind the bot's back
            await self._retirement.resume()

    async def _start_read_only(self) -> None:
        """Load the items, their word index and their vectors as the bot's start leaves them, writing
        nothing."""
        await self.items.load()
        if self.chat_scope:
            await self.items.separate_chats()  # in memory only: the bot writes the split at its start
        if self._reading is not None:
            await self._reading.start(embed_missing=False)

    def _writable(self) -> None:
        if self.read_only:
            raise RuntimeError(f"memory under {self.root} was opened read-only")

    async def close(self) -> None:
        """Wait for background consolidations (each has its own deadline, so this ends); the running
        bot also writes which items were recalled since the last maintenance. Read-only: only the
        query embeddings still under way are stopped."""
        if self.read_only:
            if self._reading is not None:
                await self._reading.close()
            return
        await self._retirement.close()
        await self._upkeep.settled()  # one an answer or a consolidation started
        if self._reading is not None:
            await self._reading.close()
        await asyncio.gather(self.items.drain(), self._recorder.drain())
        await self._recorder.settle_failed()
        await self._recorder.lazy.close()
        # The next start reads these two instead of parsing and re-tokenizing every item.
        await self.items.save_snapshot()
        if self._reading is not None:
            await self._reading.retriever.save()
        await self._upkeep.close()

    # -- write path -------------------------------------------------------------------------------

    async def record_exchanges(
        self, exchanges: Sequence[Exchange], *, replay: bool = False, sync: bool = True
    ) -> list[MemoryItem]:
        """Daily-note lines and heuristic items for answered turns (see :meth:`Recorder.record` for
        ``replay`` and ``sync``); what was stored is then promoted, and maintained when due."""
        self._writable()
        stored = await self._recorder.record(exchanges, replay=replay, sync=sync)
        await self._upkeep.promote(stored)
        self._upkeep.start_when_due()
        return stored

    async def recover(self, session: Session) -> int:
        """Record again the messages of ``session`` that have no items: a power cut lost them before
        their fsync (see lazy_sync.py). Returns how many; note lines already written are not repeated."""
        self._writable()
        missing = self._recorder.unrecorded(session)
        exchanges = exchanges_of(session, missing)
        if exchanges:
            await self.record_exchanges(exchanges, replay=True)
        return len(missing)

    async def recovered(self) -> None:
        """Every session was checked (:meth:`recover`): the marker a previous run left can go."""
        self._writable()
        await self._recorder.lazy.recovered()
        self.unsynced_since = None

    async def settled(self) -> None:
        """Return once the maintenance an answer or a consolidation started in the background (the
        running bot's, when due) has finished."""
        await self._upkeep.settled()

    async def maintain(self) -> dict[str, int]:
        """Promotion, decay and log compaction: in-memory scans plus a write only for what changed."""
        self._writable()
        return await self._upkeep.maintain()

    # -- retire path ------------------------------------------------------------------------------

    async def archive_messages(self, session_id: str, messages: Sequence[Message]) -> int:
        """Keep ``messages`` in the archive before they leave the session; what was recorded of them
        without an fsync is synced first (the next start can only record again what a session holds)."""
        self._writable()
        return await self._retirement.archive_messages(session_id, messages)

    async def consolidate(
        self,
        session: Session | str,
        messages_to_retire: Sequence[Message],
        *,
        timeout: float | None = None,
    ) -> ConsolidationResult:
        """Archive, then consolidate ``messages_to_retire`` into HISTORY/MEMORY.md (compaction, ``/new``);
        see :meth:`Retirement.consolidate <bot.memory.retirement.Retirement.consolidate>`."""
        self._writable()
        return await self._retirement.consolidate(session, messages_to_retire, timeout=timeout)

    async def consolidate_in_background(
        self, session_id: str, messages_to_retire: Sequence[Message]
    ) -> asyncio.Task[ConsolidationResult] | None:
        """Archive ``messages_to_retire`` and record them as pending, then consolidate them without
        waiting (:meth:`close` waits); None when they were all archived before."""
        self._writable()
        return await self._retirement.in_background(session_id, messages_to_retire)

    @property
    def pending_consolidations(self) -> int:
        return self._retirement.pending

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
        return await self._read().relevant.search(
            query, k=k, layers=layers, touch=touch, session_id=session_id
        )

    def prefetch(self, query: str) -> None:
        """Start the work for ``query`` that can go ahead of its turn (the query's vector), without
        waiting for it. A turn that then asks for the same text finds it made or in the making."""
        self._read().relevant.prefetch(query)

    async def pack(
        self,
        query: str,
        *,
        soft: int | None = None,
        hard: int | None = None,
        session_id: str | None = None,
        now: datetime | None = None,
        skip: Collection[MessageKey] = (),
        askers: Mapping[str, str] | None = None,
    ) -> MemoryPack:
        """The ``## Relevant Memory`` section for ``query``; see
        :meth:`RelevantMemory.pack <bot.memory.relevant.RelevantMemory.pack>`."""
        return await self._read().relevant.pack(
            query, soft=soft, hard=hard, session_id=session_id, now=now, skip=skip, askers=askers
        )

    async def context(
        self,
        query: str,
        *,
        session_id: str = "",
        now: datetime | None = None,
        shown: Collection[str] = (),
        budget: int | None = None,
        askers: Mapping[str, str] | None = None,
    ) -> MemoryContext:
        """The ``# Memory`` section for a turn of ``session_id`` whose user wrote ``query``: see
        :meth:`MemorySection.build` for ``now``, ``shown``, ``budget`` and ``askers``."""
        return await self._read().section.build(
            query, session_id=session_id, now=now, shown=shown, budget=budget, askers=askers
        )

    def last_recall(self, session_id: str) -> dict[str, object] | None:
        """What the last ``# Memory`` built for ``session_id`` in this process retrieved, if any."""
        return self._read().section.last_recall(session_id)

    def default_budget(self) -> int:
        """The memory section's tokens when no window constrains it: the configured caps added up."""
        return self._read().section.default_budget()
