"""A chat whose id changed takes its conversation and memory along (``telegram:<old>`` → ``<new>``).

A Telegram group an admin upgrades to a supergroup gets a new chat id (channels/telegram/access.py).
The channel records the move here (:func:`record_move`, in ``state/session_moves.json``) when Telegram
announces it, before the update leaves its journal (after a kill there, the update is taken in again
and the move recorded at the next start, and carried at the one after); the next start carries it
(:func:`carry_moves`), before any session is loaded or answered. At the start, because nothing holds
a session then (no cache, no lease, no turn) so files move under nobody's feet, and because the new id
is answered only once the operator added it to ``telegram.allowed_groups``, which takes a restart.

What moves, each step safe to do again after a kill (the move stays recorded until all of it is done):

- the items that name the old chat: new versions that name the new one (so chat scope's recall, and the
  workspace scope's "this chat" mark, find them as the group's own);
- the consolidations a kill cut short in the old chat (bot/memory/pending.py): their records name the
  new one, before they are resumed, so their facts, notes and archive lines are the group's too;
- the chat's transcript archive (what left the conversation, which the memory tool searches) and, in
  chat scope, its folder (its MEMORY.md and daily notes): one rename each;
- the session: written under the new id (marked ``moved_from``), with the answers its log saved
  (a kill between saving an answer and sending it), then the old one deleted;
- the tool-call journal of a turn a kill cut (bot/tools/journal.py): one rename, over the new id's own
  record when that names a turn that ended. Its message goes on pending under the new id, and the rerun
  finds the calls the turn made (left behind, a shell command or an ``append`` ran again);
- the chat's inbox (bot/inbox.py): the messages accepted and not yet answered, and the answers kept
  unsent, written into the new id's file ahead of what it holds (one atomic write: a repeat finds their
  ids there and writes nothing), then the old file removed. Left behind, they were answered or sent
  again to the old id, which Telegram refuses for good after the upgrade.
- the chat's wait for the model (bot/model_wait.py, ``state/model_wait.json``): its record under the
  new id, after the inbox, so the start goes on with the same wait for the moved messages (no second
  notice, the same max age) rather than ending it as answered.

Never one side lost: when the new id has a session (or a memory folder) of its own already, as where
``allowed_groups`` admits every group and the supergroup was answered before the restart, both are
kept and the log says so (``session_move_conflict``). The old session's turns stay in it then (the
supergroup's conversation goes on without them); only the answers its log saved are added to the new
session's log, so the messages they answer, pending under the new id, are sent them and not answered
by the model a second time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from bot import damaged, inbox_file
from bot.damaged import UNREADABLE
from bot.domain import InboundMessage, Session
from bot.errors import ConfigError, StorageError
from bot.outbox import PendingReply
from bot.sessions import JsonSessionStore
from bot.storage import atomic_write_bytes, atomic_write_text, line_bytes

if TYPE_CHECKING:  # (the Telegram channel records moves: it need not load memory's or tools' modules)
    from bot.memory import MemoryService
    from bot.tools import ToolJournal

log = structlog.get_logger(__name__)

MOVES_FILE = "session_moves.json"
META_MOVED_FROM = "moved_from"


def _read(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except UNREADABLE:
        log.error("session_moves_unreadable", path=str(path), fix="fix or delete the file, then restart")
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


async def record_move(state_dir: Path, old: str, new: str) -> None:
    """Note that session ``old`` is to move to ``new`` at the next start (durable on return; once)."""
    path = state_dir / MOVES_FILE

    def write() -> None:
        moves = _read(path)
        if moves.get(old) != new:
            atomic_write_text(path, json.dumps({**moves, old: new}, indent=1))

    await asyncio.to_thread(write)


async def carry_moves(
    state_dir: Path, store: JsonSessionStore, memory: MemoryService | None, *, inbox_dir: Path
) -> None:
    """Carry every recorded move (see the module doc); call at the start, before sessions are used and
    before the inbox in ``inbox_dir`` is loaded. A write a full or read-only disk refuses stops the
    start with a :class:`ConfigError` naming the place and the fix; the move waits for the next."""
    path = state_dir / MOVES_FILE
    moves = await asyncio.to_thread(_read, path)
    from bot.tools import ToolJournal  # (here: the channel that records moves needs no tools)

    journal = ToolJournal.of(state_dir)
    for old, new in moves.items():
        where = state_dir  # (what the step below writes, for the error: a write's own names no file)
        try:
            if memory is not None:
                where = memory.root
                await _move_memory(memory, old, new)
            where = store.directory
            await _move_session(store, old, new)
            where = journal.path_for(new).parent
            await _move_journal(journal, inbox_dir, old, new)
            where = inbox_dir
            await asyncio.to_thread(_move_inbox, inbox_dir, old, new)
            where = state_dir
            await _move_wait(state_dir, old, new)
        except (OSError, StorageError) as exc:
            raise _cannot_move(path, old, new, where, exc) from exc
        log.info("session_moved", old_session=old, new_session=new)
    if moves:

        def forget() -> None:
            left = {k: v for k, v in _read(path).items() if moves.get(k) != v}
            atomic_write_text(path, json.dumps(left, indent=1))

        try:
            await asyncio.to_thread(forget)
        except OSError as exc:  # every move is made: the next start finds each done and changes nothing
            log.warning("session_moves_not_forgotten", path=str(path), error=exc.strerror or str(exc))


def _cannot_move(path: Path, old: str, new: str, where: Path, exc: OSError | StorageError) -> ConfigError:
    """The start's error for a move a full or read-only disk refused: what, where, the fix, and that it
    waits. Nothing is lost: every step is safe to do again and the move stays in ``path`` until all are
    done, so the next start carries it (a ConfigError: restarting before the fix fails the same way)."""
    said = str(exc) if isinstance(exc, StorageError) else f"{exc.filename or where}: {exc.strerror or exc}"
    return ConfigError(
        f"cannot move chat {old} to {new} (a Telegram group that became a supergroup) at the start: "
        f"{said}. Free disk space there or let membot's user write to it, then start membot again; "
        f"nothing is lost: the move stays recorded in {path} and is finished at the next start."
    )


async def _move_memory(memory: MemoryService, old: str, new: str) -> None:
    await memory.pending.move(old, new)  # (not resumed yet: see MemoryService.start)
    items = memory.items
    moved = [
        item.with_changes(
            references=tuple(
                dataclasses.replace(ref, session_id=new) if ref.session_id == old else ref
                for ref in item.references
            )
        )
        for item in items.items()
        if any(ref.session_id == old for ref in item.references)
    ]
    if moved:
        await items.put_many(moved)
    # MEMORY.md and notes (chat scope); what left the conversation
    await _move_files(memory.chats.folder(old), memory.chats.folder(new), old, new)
    await _move_files(memory.archive.path_for(old), memory.archive.path_for(new), old, new)


async def _move_files(before: Path, after: Path, old: str, new: str) -> None:
    if not await asyncio.to_thread(_rename, before, after):
        log.warning(
            "session_move_conflict",
            old_session=old,
            new_session=new,
            kept=[str(before), str(after)],
            reason="the new chat has files of its own: both are kept",
            fix=f"merge {before} into {after} by hand if the group wants it",
        )


def _rename(before: Path, after: Path) -> bool:
    """``before`` renamed to ``after`` (atomic); False when both exist (nothing is moved then)."""
    if not before.exists():
        return True
    if after.exists():
        return False
    os.rename(before, after)
    return True


async def _move_journal(journal: ToolJournal, inbox_dir: Path, old: str, new: str) -> None:
    """Before the inbox moves: ``new``'s pending messages are then its own, whose cut turn its record
    may be (see :meth:`ToolJournal.move`)."""
    waiting = await asyncio.to_thread(_waiting, inbox_dir, new)
    if not await journal.move(old, new, waiting=waiting):
        log.warning(
            "session_move_conflict",
            old_session=old,
            new_session=new,
            kept=str(journal.path_for(old)),
            reason="a turn of the new chat was cut too and a chat keeps one turn's tool calls: both turns'"
            " calls may run again",
        )


def _waiting(directory: Path, sid: str) -> set[str]:
    """The platform ids of chat ``sid``'s pending messages (blocking)."""
    try:
        read = inbox_file.read(inbox_file.path_of(directory, sid))
    except FileNotFoundError:
        return set()
    return {entry.message.message_id for entry, _ in read.pending.values() if entry.message.message_id}


async def _move_session(store: JsonSessionStore, old: str, new: str) -> None:
    session = await store.load(old)
    if session is None:
        return
    there = await store.load(new)
    if there is not None:
        if there.metadata.get(META_MOVED_FROM) == old:  # a kill came between the two steps
            await store.delete(old)
            return
        carried = await _carry_replies(store, there, old)
        log.warning(
            "session_move_conflict",
            old_session=old,
            new_session=new,
            reason="the new chat has a conversation of its own already: both sessions are kept",
            answers_carried=carried,
            fix=f"`membot sessions show {old}` shows the old conversation",
        )
        return
    channel, _, chat = new.partition(":")
    replies = [_moved(reply, channel, chat) for reply in await store.replies(old)]
    moved = Session(
        id=new,
        channel=channel,
        chat_id=chat,
        messages=list(session.messages),
        metadata={**session.metadata, META_MOVED_FROM: old},
        state=session.state,
        created_at=session.created_at,
        updated_at=session.updated_at,
        usage=session.usage,
        compactions=session.compactions,
    )
    # A new session: one atomic rewrite (log, then the header naming it).
    await store.save(moved, replies=replies)
    await store.delete(old)


async def _carry_replies(store: JsonSessionStore, there: Session, old: str) -> int:
    """The answers ``old``'s log saved, added to the log of the new chat's own session ``there``; how many.

    Left in the old log, the messages they answer (pending under the new id once the inbox moved) were
    answered by the model again: a second answer made, and a different one. One append of the new log
    (a kill cuts it off whole, see bot/session_log.py), of those whose id it does not hold yet: a repeat
    after a kill adds none twice. Recovery then sends them, as it sends any answer a log saved."""
    held = {reply.id for reply in await store.replies(there.id)}
    carried = [
        _moved(reply, there.channel, there.chat_id)
        for reply in await store.replies(old)
        if reply.id not in held
    ]
    if carried:
        await store.save(there, replies=carried)
    return len(carried)


def _move_inbox(directory: Path, old: str, new: str) -> None:
    """The old id's pending messages and kept answers into the new id's inbox file (blocking)."""
    before, after = inbox_file.path_of(directory, old), inbox_file.path_of(directory, new)
    try:
        read = inbox_file.read(before)
    except FileNotFoundError:
        return
    there = inbox_file.read(after) if after.exists() else None
    held = set(there.pending) | set(there.kept) if there is not None else set()
    channel, _, chat = new.partition(":")

    def moved(message: InboundMessage) -> InboundMessage:
        return dataclasses.replace(message, channel=channel, chat_id=chat)

    lines = [
        inbox_file.entry_line(dataclasses.replace(entry, message=moved(entry.message)))
        for entry, _ in read.pending.values()
        if entry.entry_id not in held
    ]
    kept = [_moved(reply, channel, chat) for reply, _ in read.kept.values() if reply.id not in held]
    lines += [inbox_file.reply_line(reply) for reply in kept]
    if lines:  # ahead of the new id's own lines: the old chat asked first
        data = b"".join(line_bytes(line) for line in lines)
        atomic_write_bytes(after, data + (after.read_bytes() if there is not None else b""))
    damaged.keep_aside(before, read.unreadable, event="inbox_lines_set_aside")
    before.unlink()
    if lines:
        log.info("session_inbox_moved", old_session=old, new_session=new, lines=len(lines))


async def _move_wait(state_dir: Path, old: str, new: str) -> None:
    from bot.model_wait import WAIT_FILE, move_record  # (here: the channel needs no pipeline)

    path = state_dir / WAIT_FILE
    if not await asyncio.to_thread(move_record, path, old, new):
        log.warning(
            "session_move_conflict",
            old_session=old,
            new_session=new,
            kept=str(path),
            reason="the new chat waits for the model too: its wait goes on, with the old chat's messages",
        )


def _moved(reply: PendingReply, channel: str, chat: str) -> PendingReply:
    return dataclasses.replace(reply, channel=channel, chat_id=chat)
