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
- the chat's transcript archive (what left the conversation, which the memory tool searches) and, in
  chat scope, its folder (its MEMORY.md and daily notes): one rename each;
- the session: written under the new id (marked ``moved_from``), then the old one deleted.

Never one side lost: when the new id has a session (or a memory folder) of its own already, as where
``allowed_groups`` admits every group and the supergroup was answered before the restart, both are
kept and the log says so (``session_move_conflict``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from bot.damaged import UNREADABLE
from bot.domain import Session
from bot.sessions import JsonSessionStore
from bot.storage import atomic_write_text

if TYPE_CHECKING:  # (the Telegram channel records moves: it need not load memory's modules)
    from bot.memory import MemoryService

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


async def carry_moves(state_dir: Path, store: JsonSessionStore, memory: MemoryService | None) -> None:
    """Carry every recorded move (see the module doc); call at the start, before sessions are used."""
    path = state_dir / MOVES_FILE
    moves = await asyncio.to_thread(_read, path)
    for old, new in moves.items():
        if memory is not None:
            await _move_memory(memory, old, new)
        await _move_session(store, old, new)
        log.info("session_moved", old_session=old, new_session=new)
    if moves:

        def forget() -> None:
            left = {k: v for k, v in _read(path).items() if moves.get(k) != v}
            atomic_write_text(path, json.dumps(left, indent=1))

        await asyncio.to_thread(forget)


async def _move_memory(memory: MemoryService, old: str, new: str) -> None:
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
    for before, after in (
        (memory.chats.folder(old), memory.chats.folder(new)),  # MEMORY.md and notes (chat scope)
        (memory.archive.path_for(old), memory.archive.path_for(new)),  # what left the conversation
    ):
        if not await asyncio.to_thread(_rename, before, after):
            log.warning(
                "session_move_conflict",
                old_session=old,
                new_session=new,
                kept=[str(before), str(after)],
                reason="the new chat has memory files of its own: both are kept",
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


async def _move_session(store: JsonSessionStore, old: str, new: str) -> None:
    session = await store.load(old)
    if session is None:
        return
    there = await store.load(new)
    if there is not None:
        if there.metadata.get(META_MOVED_FROM) == old:  # a kill came between the two steps
            await store.delete(old)
            return
        log.warning(
            "session_move_conflict",
            old_session=old,
            new_session=new,
            reason="the new chat has a conversation of its own already: both sessions are kept",
            fix=f"`membot sessions show {old}` shows the old conversation",
        )
        return
    channel, _, chat = new.partition(":")
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
    await store.save(moved)  # a new session: one atomic rewrite (log, then the header naming it)
    await store.delete(old)
