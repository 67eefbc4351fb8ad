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
        self._notes_writer = GroupWriter("notes-writer")
        self.lazy = LazySync(marker, self.flush)
        # The running bot's turns whose writes failed (a full disk): made again at the next record, at
        # close, or by the next start (the marker stays: see :meth:`settle_failed`).
        self._failed: list[Exchange] = []

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
        if self._failed and not sync:
            await self.retry_failed()
        try:
            return await self._record(exchanges, replay=replay, sync=sync)
        except OSError:
            if not sync:
                self._failed += exchanges
            raise

    async def retry_failed(self, *, sync: bool = False) -> bool:
        """Record again the turns whose writes failed, as a replay (a note line already written is not
        repeated; an item merges with itself, and its new version is written); whether none is left."""
        failed, self._failed = self._failed, []
        if not failed:
            return True
        try:
            await self._record(failed, replay=True, sync=sync)
        except OSError as exc:
            self._failed = failed + self._failed
            log.warning("memory_rewrite_failed", turns=len(failed), error=f"{type(exc).__name__}: {exc}")
            return False
        log.info("memory_rewritten", turns=len(failed))
        return True

    async def settle_failed(self) -> None:
        """At close: make the failed turns again, or else keep the marker, holding a time before them,
        so that the next start records them again from their sessions (lazy_sync.py)."""
        if await self.retry_failed(sync=True):
            return
        said = [m.timestamp for ex in self._failed for m in (ex.user, ex.assistant) if m is not None]
        await self.lazy.keep(min([self._clock(), *said]))

    async def _record(self, exchanges: Sequence[Exchange], *, replay: bool, sync: bool) -> list[MemoryItem]:
        note_lines: dict[Path, list[str]] = {}
        utterances: list[Utterance] = []
        for ex in exchanges:
            if ex.user is not None and ex.assistant is not None:
                notes = self._notes_for(ex.session_id)
                # The exchange happened when the user wrote; a date in the future (a platform's or a
                # sender's clock) is filed under today, not under a day no note has reached yet.
                when = notes.local(min(ex.user.timestamp, self._clock()))
                line = note_line(when, ex.user.content, ex.assistant.content)
                note_lines.setdefault(notes.path_for(when.date()), []).append(line)
            for msg, turn in ((ex.user, ex.user_turn), (ex.assistant, ex.assistant_turn)):
                if msg is not None and msg.content.strip():
                    ref = Reference(ex.session_id, msg.id, turn, conversation=ex.conversation)
                    utterances.append(
                        Utterance(msg.role.value, msg.content, msg.timestamp, ref, *_speaker(msg))
                    )
        # The notes and the items are separate files: their writes (and fsyncs) go on side by side.
        async with contextlib.nullcontext() if sync else self.lazy.writing():
            stored, _ = await asyncio.gather(
                self._items.add_many(extract(utterances), sync=sync),
                self._append_notes(note_lines, replay=replay, sync=sync),
            )
        return stored

    async def _append_notes(self, note_lines: dict[Path, list[str]], *, replay: bool, sync: bool) -> None:
        for path, lines in note_lines.items():
            if replay:
                lines = await asyncio.to_thread(not_yet_in, path, lines)
            if lines:
                await self._notes_writer.append(path, line_bytes("\n".join(lines)), sync=sync)

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
            and not self._items.of_message((session.id, m.id))
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
