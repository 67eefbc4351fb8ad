"""The write path: answered turns become daily-note lines and heuristic items.

A batch of exchanges makes one write per file. The running bot writes without an fsync and syncs a
moment later (lazy_sync.py); what a power cut lost is still in the sessions, and :func:`exchanges_of`
pairs those messages up again to be recorded once more.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import structlog

from bot.domain import SPEAKER_META, Message, Role, Session
from bot.group_writer import GroupWriter
from bot.memory.extract import Utterance, extract
from bot.memory.item_store import ItemStore
from bot.memory.items import MemoryItem, Reference
from bot.memory.lazy_sync import LazySync
from bot.memory.notes import DailyNotes, not_yet_in, note_line
from bot.storage import line_bytes

log = structlog.get_logger(__name__)

CONVERSATION_KEY = "conversation"  # session.metadata: the conversation going on (set by MemoryPersist)


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


class Recorder:
    """Writes what answered turns leave: a note line per exchange in its day's file (``notes_for`` the
    session), and the items :func:`~bot.memory.extract.extract` finds in each message.

    It owns the writes' durability: the notes writer and the :class:`LazySync` over it and the item
    store (``lazy``). Promotion and maintenance after a write are the caller's (see upkeep.py).
    """

    def __init__(
        self,
        items: ItemStore,
        notes_for: Callable[[str], DailyNotes],
        *,
        marker: Path,
        clock: Callable[[], datetime],
    ) -> None:
        self._items = items
        self._notes_for = notes_for
        self._clock = clock
        self._notes_writer = GroupWriter("notes-writer", editable=True)  # (the operator's too)
        self.lazy = LazySync(marker, self.flush)
        # The running bot's turns whose writes failed (a full disk): made again at the next record, at
        # close, or by the next start (the marker stays: see :meth:`settle_failed`). Their items and
        # their note lines apart: a note line that was written is not written again, since the operator
        # may have edited it meanwhile (a replay would bring the bot's wording back beside theirs).
        self._failed: list[Exchange] = []
        self._unnoted: list[Exchange] = []

    async def record(
        self, exchanges: Sequence[Exchange], *, replay: bool = False, sync: bool = True
    ) -> list[MemoryItem]:
        """Daily-note lines and heuristic items for answered turns (batched: one write per file).

        ``replay`` (imports) skips note lines already written, so an interrupted import can be run
        again; items need no such care, since a repeated item merges by fingerprint. ``sync=False``
        (the running bot, whose sessions hold the messages durably): written now, fsynced a moment
        later (see lazy_sync.py). Returns the items stored.

        With ``sync=False`` a failed write is remembered and made again (:meth:`retry_failed`) before
        the next record: its answer went out, and the session holds its messages; memory must too.
        """
        if (self._failed or self._unnoted) and not sync:
            await self.retry_failed()
        return await self._record(exchanges, exchanges, replay=replay, sync=sync, keep=not sync)

    async def retry_failed(self, *, sync: bool = False) -> bool:
        """Record again what failed of the turns: their items (an item merges with itself, and its new
        version is written) and the note lines whose append failed (it left nothing: ``append_bytes``);
        whether none is left."""
        items, self._failed = self._failed, []
        notes, self._unnoted = self._unnoted, []
        turns = len({id(ex) for ex in (*items, *notes)})
        if not turns:
            return True
        try:
            await self._record(items, notes, replay=True, sync=sync, keep=True)
        except OSError as exc:
            log.warning("memory_rewrite_failed", turns=turns, error=f"{type(exc).__name__}: {exc}")
            return False
        log.info("memory_rewritten", turns=turns)
        return True

    async def settle_failed(self) -> None:
        """At close: make the failed turns again, or else keep the marker, holding a time before them,
        so that the next start records them again from their sessions (lazy_sync.py)."""
        if await self.retry_failed(sync=True):
            return
        failed = (*self._failed, *self._unnoted)
        said = [m.timestamp for ex in failed for m in (ex.user, ex.assistant) if m is not None]
        await self.lazy.keep(min([self._clock(), *said]))

    async def _record(
        self,
        items_of: Sequence[Exchange],
        notes_of: Sequence[Exchange],
        *,
        replay: bool,
        sync: bool,
        keep: bool,
    ) -> list[MemoryItem]:
        """The items of ``items_of`` and the note lines of ``notes_of``; ``keep``: what fails of them is
        remembered for :meth:`retry_failed` (each half apart) before the first failure is raised."""
        note_lines: dict[Path, list[tuple[Exchange, str]]] = {}
        for ex in notes_of:
            if ex.user is not None and ex.assistant is not None:
                notes = self._notes_for(ex.session_id)
                # The exchange happened when the user wrote; a date in the future (a platform's or a
                # sender's clock) is filed under today, not under a day no note has reached yet.
                when = notes.local(min(ex.user.timestamp, self._clock()))
                line = note_line(when, ex.user.content, ex.assistant.content)
                note_lines.setdefault(notes.path_for(when.date()), []).append((ex, line))
        utterances: list[Utterance] = []
        for ex in items_of:
            for msg, turn in ((ex.user, ex.user_turn), (ex.assistant, ex.assistant_turn)):
                if msg is not None and msg.content.strip():
                    ref = Reference(ex.session_id, msg.id, turn, conversation=ex.conversation)
                    utterances.append(
                        Utterance(msg.role.value, msg.content, msg.timestamp, ref, *_speaker(msg))
                    )
        # The notes and the items are separate files: their writes (and fsyncs) go on side by side.
        unnoted: list[Exchange] = []
        try:
            async with contextlib.nullcontext() if sync else self.lazy.writing():
                stored, noted = await asyncio.gather(
                    self._items.add_many(extract(utterances), sync=sync),
                    self._append_notes(note_lines, unnoted, replay=replay, sync=sync),
                    return_exceptions=True,
                )
        except OSError:  # the marker could not be placed: nothing was written
            if keep:
                self._failed += items_of
                self._unnoted += notes_of
            raise
        if keep:
            self._failed += items_of if isinstance(stored, OSError) else []
            self._unnoted += unnoted
        for result in (stored, noted):
            if isinstance(result, BaseException):
                raise result
        assert isinstance(stored, list)
        return stored

    async def _append_notes(
        self,
        note_lines: dict[Path, list[tuple[Exchange, str]]],
        unnoted: list[Exchange],
        *,
        replay: bool,
        sync: bool,
    ) -> None:
        """Append each file's lines; the exchanges of a file whose append failed go to ``unnoted`` (every
        file is tried), and the first failure is raised."""
        failure: OSError | None = None
        for path, pairs in note_lines.items():
            lines = [line for _, line in pairs]
            try:
                if replay:
                    lines = await asyncio.to_thread(not_yet_in, path, lines)
                if lines:
                    await self._notes_writer.append(path, line_bytes("\n".join(lines)), sync=sync)
            except OSError as exc:
                unnoted += [ex for ex, _ in pairs]
                failure = failure or exc
        if failure is not None:
            raise failure

    async def flush(self) -> None:
        """fsync what :meth:`record` wrote with ``sync=False`` (for :class:`LazySync`)."""
        await asyncio.gather(self._items.sync(), self._notes_writer.sync())

    async def drain(self) -> None:
        """Wait for the note lines still being written."""
        await self._notes_writer.drain()

    def unrecorded(self, session: Session) -> list[Message]:
        """The messages of ``session`` that have no items: a power cut lost them before their fsync
        (see lazy_sync.py)."""
        # Every message is looked at, not only the newest: one message's items may go to another day's
        # file than the next one's, and a power cut may keep either. A session holds few (it is trimmed
        # past ``memory_window``, after a sync), and a deleted item still counts as its message's.
        return [
            m
            for m in session.messages
            if m.role in (Role.USER, Role.ASSISTANT)
            and m.content.strip()
            and not m.tool_calls  # a step of the tool loop, not an answer (never recorded)
            and not self._items.index.of_message((session.id, m.id))
        ]


def exchanges_of(session: Session, messages: Sequence[Message]) -> list[Exchange]:
    """``messages`` of ``session`` (users' and answers, in order) paired up as exchanges: each answer
    with the user message before it; a user message with no answer, or an answer with none, alone."""
    talk = session.metadata.get(CONVERSATION_KEY)
    talk = talk if isinstance(talk, str) else ""
    exchanges: list[Exchange] = []
    users: list[Message] = []
    for message in messages:
        if message.role is Role.USER:
            users.append(message)
            continue
        asked: list[Message | None] = [*users] or [None]
        exchanges += [Exchange(session.id, u, None, conversation=talk) for u in asked[:-1]]
        exchanges.append(Exchange(session.id, asked[-1], message, conversation=talk))
        users = []
    exchanges += [Exchange(session.id, u, None, conversation=talk) for u in users]
    return exchanges


def _speaker(message: Message) -> tuple[str, str]:
    """Who said a group message: the name its text starts with, and their id (see bot/intake.py's
    ``user_message``); empty in a private chat."""
    name = message.meta.get(SPEAKER_META)
    if not isinstance(name, str) or not name or not message.content.startswith(f"{name}: "):
        return "", ""
    return name, str(message.meta.get("sender_id") or "")
