"""The retire path: messages leaving a session are archived, then consolidated into HISTORY and MEMORY.md.

The facts a consolidation finds are stored as episodic items too, so retrieval finds them beside what
was said. Compaction and ``/new`` await :meth:`Retirement.consolidate`; the running bot's trims start
it in the background (:meth:`Retirement.in_background`), and :meth:`Retirement.close` waits for those.

Messages are retired once: those the archive holds already are skipped, and the others are recorded
as pending (bot/memory/pending.py) before they reach the archive. A kill before their consolidation
is written leaves that record, and :meth:`Retirement.resume` (the next start) finishes the work. A
consolidation whose writes storage refused (a full disk), awaited or in the background, is made again,
the same way, after the next retirement whose own writes went through: the running bot need not be
restarted for it. A record the start could not archive (the same full disk) is tried again before
each later retirement.

One chat's consolidations are made in the order its messages were said: an older one made after a
newer one would write HISTORY out of order and could set MEMORY.md back to what the chat has since
corrected ("vegetarian" after "eats fish again"). So a record that cannot be archived yet keeps the
later records of its chat, and its chat's new retirements, waiting behind it (those are refused: their
messages stay in the session, as when the disk refuses their own archive); other chats go on.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from datetime import datetime

import structlog

from bot.config import MemorySettings
from bot.domain import Message, Role, Session
from bot.errors import StorageError
from bot.memory.archive import TranscriptArchive
from bot.memory.consolidation import ConsolidationResult, Consolidator
from bot.memory.item_store import ItemStore
from bot.memory.items import Layer, MemoryItem, Reference, fingerprint, make_title
from bot.memory.lazy_sync import LazySync
from bot.memory.longterm import LongTermMemory
from bot.memory.pending import DurableFact, PendingConsolidations, PendingWork
from bot.memory.upkeep import Upkeep

log = structlog.get_logger(__name__)


class Retirement:
    """Archives and consolidates what leaves a session, awaited or in the background.

    ``longterm_for`` picks the MEMORY.md a session's consolidation writes (the chat's own in chat
    scope); ``lazy`` is the write path's lazy sync, flushed before anything is archived.
    """

    def __init__(
        self,
        archive: TranscriptArchive,
        consolidator: Consolidator,
        items: ItemStore,
        pending: PendingConsolidations,
        upkeep: Upkeep,
        settings: MemorySettings,
        *,
        lazy: LazySync,
        longterm_for: Callable[[str], LongTermMemory],
        clock: Callable[[], datetime],
    ) -> None:
        self._archive = archive
        self._consolidator = consolidator
        self._items = items
        self._pending = pending
        self._upkeep = upkeep
        self._settings = settings
        self._lazy = lazy
        self._longterm_for = longterm_for
        self._clock = clock
        self._tasks: set[asyncio.Task[ConsolidationResult]] = set()
        # Consolidations storage refused (awaited or in the background): their records wait on disk;
        # made again after the next retirement the disk takes (else by the next start).
        self._stalled: list[PendingWork] = []
        # Records whose archive the disk refused at the start, and the later ones of their chats, in
        # order: tried again before each retirement (:meth:`_resume_waiting`), else by the next start.
        self._waiting: list[PendingWork] = []
        self._resuming = asyncio.Lock()  # (two chats retiring at once: each record is started once)

    async def archive_messages(self, session_id: str, messages: Sequence[Message]) -> int:
        """Keep ``messages`` in the archive before they leave the session; what was recorded of them
        without an fsync is synced first (the next start can only record again what a session holds)."""
        if self._lazy.pending:
            await self._lazy.sync()
        return await self._archive.append(session_id, messages, self._clock())

    async def consolidate(
        self,
        session: Session | str,
        messages_to_retire: Sequence[Message],
        *,
        timeout: float | None = None,
    ) -> ConsolidationResult:
        """Archive, then consolidate ``messages_to_retire`` into HISTORY/MEMORY.md; awaited.

        In chat scope the MEMORY.md is the chat's own (``longterm_for``), never the operator's.

        Used by compaction and ``/new``. On timeout or failure a raw-fallback entry is written and
        ``result.raw_fallback`` is True; the caller may drop the messages from the session either way.
        Messages the archive held already were retired before (a kill kept them in their session):
        they are not consolidated again. One whose writes storage refused raises, and is made again
        after the next retirement the disk takes (see ``_stalled``): its messages are archived, so no
        later retirement would take them.
        """
        session_id = session if isinstance(session, str) else session.id
        work = await self._record(session_id, messages_to_retire)
        if work is None:
            return ConsolidationResult(session_id)
        try:
            return await self._finish(work, timeout=timeout, resumed=False)
        except OSError:
            self._stalled.append(work)  # its record waits on disk, as a background one's does
            raise

    async def in_background(
        self, session_id: str, messages_to_retire: Sequence[Message]
    ) -> asyncio.Task[ConsolidationResult] | None:
        """Archive ``messages_to_retire`` and record them as pending, then consolidate them without
        waiting (:meth:`close` waits); None when the archive held them all already."""
        work = await self._record(session_id, messages_to_retire)
        return None if work is None else self._start(work, resumed=False)

    async def resume(self) -> int:
        """Finish, in the background, the retirements a kill left pending (the running bot's start).

        Their messages are archived first where the kill came before that (the whole file is looked
        through: later retirements of the chat may have followed theirs). An archive the disk refuses
        (a full disk) leaves that record and the later ones of its chat waiting, in their order, for
        the next retirement (or start): the start goes on, as the chats' messages need no
        consolidation to be answered."""
        started, error = await self._archive_and_start(await self._pending.load())
        if error is not None:
            log.error(
                "consolidations_not_resumed",
                error=_described(error),
                left=len(self._waiting),
                chats=sorted({w.session_id for w in self._waiting}),
                hint="free disk space or fix the workspace's permissions; they are tried again before "
                "the next retirement, and by the next start (until then those chats retire nothing newer)",
            )
        if started:
            log.warning(
                "consolidations_resumed", count=len(started), planned=sum(w.plan is not None for w in started)
            )
        return len(started)

    async def _archive_and_start(self, works: list[PendingWork]) -> tuple[list[PendingWork], OSError | None]:
        """Archive (where a kill came first) and start ``works``, in order; those started, and the
        error of the last archive the disk refused. One refused waits in ``_waiting``, and so do the
        later ones of its chat (see the module doc); the other chats' go on."""
        started: list[PendingWork] = []
        waiting: list[PendingWork] = []
        error: OSError | None = None
        for work in works:
            if all(w.session_id != work.session_id for w in waiting):
                try:
                    work.archived = await self._archive.append(
                        work.session_id, work.messages, self._clock(), look_in="file"
                    )
                except OSError as exc:
                    error = exc
                else:
                    self._start(work, resumed=True)
                    started.append(work)
                    continue
            waiting.append(work)
        self._waiting = waiting
        return started, error

    async def _resume_waiting(self, session_id: str) -> None:
        """Before a retirement of ``session_id``: try the records the start could not archive again
        (the disk may take them now). While one of this chat still waits, this retirement waits too:
        :class:`StorageError`, and its messages stay in the session."""
        error: OSError | None = None
        async with self._resuming:
            if self._waiting:
                started, error = await self._archive_and_start(self._waiting)
                if started:
                    log.warning("consolidations_resumed", count=len(started), waiting=len(self._waiting))
            if any(w.session_id == session_id for w in self._waiting):
                raise StorageError(
                    f"an earlier retirement of {session_id} waits for the disk (consolidations_not_resumed): "
                    "this one waits behind it, its messages kept in the session"
                ) from error

    async def _record(self, session_id: str, messages: Sequence[Message]) -> PendingWork | None:
        """Record as pending, then archive, those of ``messages`` the archive does not hold yet."""
        if self._waiting:
            await self._resume_waiting(session_id)
        if self._lazy.pending:
            await self._lazy.sync()
        fresh = await self._archive.unarchived(session_id, messages)
        if not fresh:
            return None
        work = await self._pending.add(session_id, fresh, self._clock())
        try:
            work.archived = await self._archive.append(session_id, fresh, self._clock(), look_in=None)
        except Exception:
            # Nothing of them reached the archive (a failed append is cut back off), and they stay in
            # their session, whose next trim retires them again: a record kept would have them
            # consolidated a second time by the next start.
            await self._pending.done(work)
            raise
        stalled, self._stalled = self._stalled, []  # the disk took this one's writes: theirs now
        for earlier in stalled:
            # As a start resumes them, but their facts are stored again: one the disk refused is in
            # memory all the same, and would be taken for stored (a merge writes it once more).
            self._start(earlier, resumed=True, skip_stored_facts=False)
        if stalled:
            # Let them take their places in the consolidation queue (they await nothing before it)
            # ahead of this one: awaited, it would take the queue at once and be made first.
            await asyncio.sleep(0)
        return work

    def _start(
        self, work: PendingWork, *, resumed: bool, skip_stored_facts: bool | None = None
    ) -> asyncio.Task[ConsolidationResult]:
        task = asyncio.create_task(
            self._finish(work, timeout=None, resumed=resumed, skip_stored_facts=skip_stored_facts),
            name=f"consolidate:{work.session_id}",
        )
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._finished, work))
        return task

    async def _finish(
        self,
        work: PendingWork,
        *,
        timeout: float | None,
        resumed: bool,
        skip_stored_facts: bool | None = None,
    ) -> ConsolidationResult:
        """Consolidate ``work`` (writing again only what is missing of its plan when ``resumed``), store
        its facts (those found stored are skipped when ``skip_stored_facts``, by default when
        ``resumed``), and drop its pending record: a failure before then leaves it for the next start."""
        wait = self._settings.consolidation_timeout if timeout is None else timeout
        result = await self._consolidator.run(
            work.session_id,
            work.messages,
            timeout=wait,
            longterm=self._longterm_for(work.session_id),
            journal=lambda plan: self._pending.planned(work, plan),
            plan=work.plan if resumed else None,
        )
        result.archived = work.archived
        skip = resumed if skip_stored_facts is None else skip_stored_facts
        await self._store_facts(work.session_id, work.messages, result, resumed=skip)
        await self._pending.done(work)
        self._upkeep.start_when_due()
        return result

    def _finished(self, work: PendingWork, task: asyncio.Task[ConsolidationResult]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or (error := task.exception()) is None:
            return
        storage = isinstance(error, OSError)
        if storage:  # its record waits on disk (see ``_stalled``)
            self._stalled.append(work)
        log.error(
            "consolidation_crashed",
            error=_described(error),
            hint="free disk space, or fix the file the error names (its permissions, or where its link "
            "points)"
            if storage
            else None,
            made_again="after the next retirement the disk takes, else at the next start"
            if storage
            else None,
        )

    @property
    def pending(self) -> int:
        """Background consolidations not finished yet."""
        return len(self._tasks)

    async def close(self) -> None:
        """Wait for background consolidations (each has its own deadline, so this ends)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _store_facts(
        self, session_id: str, messages: Sequence[Message], result: ConsolidationResult, *, resumed: bool
    ) -> None:
        """Store the facts as items; a resumed consolidation skips those stored before its kill (the
        store would merge each into itself: a second write, and a salience bump)."""
        # Dated as of the newest message they came from, not when the consolidation ran (days later
        # for a long session or a kill's leftover): a fact dated then read as newer than what the user
        # said in between ("I started eating fish again" after "vegetarian").
        now = self._clock()
        said = max((m.timestamp for m in messages), default=now)
        refs = tuple(Reference(session_id, m.id) for m in messages if m.role is Role.USER)[:20]
        refs = refs or (Reference(session_id),)
        facts = [f for f in result.facts if not (resumed and self._stored(f, refs[0]))]
        if not facts:
            return
        items = [
            MemoryItem(
                layer=Layer.EPISODIC,
                type=fact.type,
                title=make_title(fact.content),
                content=fact.content,
                source="consolidation",
                confidence=fact.confidence,
                salience=0.75,
                created_at=said,
                updated_at=now,
                last_accessed_at=now,  # (stored now: decay counts from here)
                references=refs,
            )
            for fact in facts
        ]
        await self._upkeep.promote(await self._items.add_many(items))

    def _stored(self, fact: DurableFact, ref: Reference) -> bool:
        found = self._items.index.with_fingerprint(fingerprint(fact.type, fact.content))
        return any(ref in item.references for item in found)


def _described(error: BaseException) -> str:
    """The error for the log: its type and text, which for a refused file names it (``repr`` does not:
    ``FileNotFoundError(2, 'No such file or directory')`` left the operator to guess which)."""
    return f"{type(error).__name__}: {error}"
