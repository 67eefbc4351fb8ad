"""What the ``membot memory`` commands do, as plain async functions the CLI calls.

- ``show``   → :func:`render_for_session`: the system prompt the model would see for a session;
- ``edit``   → :func:`memory_file`: the MEMORY.md path to open in ``$EDITOR`` (edits are picked up live);
- ``search`` → :func:`search`, and :func:`unembedded` (what it found by words only);
- ``stats`` → :func:`stats`; ``import`` → :func:`import_conversations`;
- ``reindex`` → :func:`items_to_embed`: the items the bot gives a vector.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bot.domain import Message, Role
from bot.memory.importer import ImportSession, read_json, sessions_from
from bot.memory.item_index import embeddable
from bot.memory.items import Layer, MemoryItem, ScoredItem
from bot.memory.pending import PENDING_DIR
from bot.memory.prompt import system_prompt
from bot.memory.recorder import Exchange
from bot.memory.service import MemoryService

Progress = Callable[[int, int], None]  # (sessions done, sessions total)


async def render_for_session(
    service: MemoryService,
    base_prompt: str,
    history: Sequence[Message] = (),
    query: str | None = None,
    *,
    session_id: str = "",
) -> str:
    """The system prompt for the next turn of ``session_id``.

    ``query`` defaults to the last user message in ``history``. In chat scope the memory shown is that
    chat's, exactly as its model would see it (no session: the operator's MEMORY.md alone).
    """
    if query is None:
        query = next((m.content for m in reversed(history) if m.role is Role.USER), "")
    context = await service.context(query, session_id=session_id)
    return system_prompt(base_prompt, context.text)


def memory_file(service: MemoryService) -> Path:
    return service.longterm.path


async def search(
    service: MemoryService, query: str, *, k: int = 10, session_id: str | None = None
) -> list[ScoredItem]:
    """Items matching ``query``: of every chat, or in chat scope of ``session_id``'s chat only."""
    return await service.search(query, k=k, session_id=session_id)


def unembedded(service: MemoryService, *, session_id: str | None = None) -> int | None:
    """How many of the items a search of ``session_id`` sees would get a vector but have none yet (the
    bot embeds them in the background): those are found by their words only. None without vectors."""
    vectors = service.vectors
    if vectors is None:
        return None
    return sum(
        1
        for item in service.items.items()
        if embeddable(item) and service.visible(item, session_id) and vectors.lacks(item)
    )


def items_to_embed(service: MemoryService) -> list[MemoryItem]:
    """The items the running bot embeds (what the user said and the facts, not the answers): what
    ``membot memory reindex`` embeds, so that a bot started after it has nothing left to do."""
    return [item for item in service.items.items() if embeddable(item)]


@dataclass(frozen=True, slots=True)
class MemoryStats:
    memory_md_bytes: int
    history_bytes: int
    today_notes: int
    items: dict[str, int]
    archived_sessions: int
    last_consolidation: str | None
    last_consolidation_fallback: bool | None
    pending_consolidations: int
    last_recall: dict[str, object] | None = None  # the session's last memory pack in this process
    vectors_waiting: int | None = None  # items queued for their vector; None: no embedding model
    vectors_failing: bool = False  # the embedding model's last batch failed (found by words meanwhile)


async def stats(service: MemoryService, *, session_id: str | None = None) -> MemoryStats:
    """Sizes and counts; in chat scope with a ``session_id``, MEMORY.md, notes and items are that chat's.

    HISTORY.md, the archive and the consolidation figures are workspace-wide in either scope.
    """
    if service.chat_scope and session_id is not None:
        longterm, notes = service.longterm_for(session_id), service.notes_for(session_id)
    else:
        longterm, notes = service.longterm, service.notes
    snap = await longterm.read()
    today = await notes.count_day(notes.local(service.now()).date())

    def sizes() -> tuple[int, int, int]:
        history = service.history.main_path
        archived = len(list((service.root / "archive").glob("*.jsonl")))
        # On disk, so `membot memory stats` (another process) counts what the bot has not finished,
        # and what a kill left for its next start.
        pending = len(list((service.root / PENDING_DIR).glob("*.json")))
        return (history.stat().st_size if history.exists() else 0), archived, pending

    history_bytes, archived, pending = await asyncio.to_thread(sizes)
    last = service.consolidator.last_result
    return MemoryStats(
        memory_md_bytes=snap.size,
        history_bytes=history_bytes,
        today_notes=today,
        items={
            layer.value: sum(1 for i in service.items.items(layer) if service.visible(i, session_id))
            for layer in Layer
        },
        archived_sessions=archived,
        last_consolidation=service.consolidator.last_run.isoformat()
        if service.consolidator.last_run
        else None,
        last_consolidation_fallback=last.raw_fallback if last else None,
        pending_consolidations=pending,
        last_recall=service.last_recall(session_id) if session_id is not None else None,
        vectors_waiting=service.vectors.pending if service.vectors is not None else None,
        vectors_failing=service.vectors is not None and service.vectors.failing,
    )


@dataclass(frozen=True, slots=True)
class ImportReport:
    sessions: int
    turns: int
    items: int


async def import_conversations(
    service: MemoryService, path: Path, *, progress: Progress | None = None
) -> ImportReport:
    """Replay the conversations in ``path`` through the normal write path (notes + items)."""
    data = await asyncio.to_thread(read_json, path)
    sessions = sessions_from(data, service.tz)
    return await import_sessions(service, sessions, progress=progress)


async def import_sessions(
    service: MemoryService, sessions: Sequence[ImportSession], *, progress: Progress | None = None
) -> ImportReport:
    turns = 0
    before = len(service.items)
    for done, session in enumerate(sessions, start=1):
        await service.record_exchanges(list(exchanges_of(session)), replay=True)
        turns += len(session.turns)
        if progress is not None:
            progress(done, len(sessions))
    # New items only: what an import run before already made merges into what is there.
    return ImportReport(len(sessions), turns, len(service.items) - before)


def exchanges_of(session: ImportSession) -> list[Exchange]:
    """Pair each user turn with the assistant turn that answers it; unpaired turns stand alone."""
    out: list[Exchange] = []
    pending: tuple[Message, int] | None = None
    for turn in session.turns:
        if turn.message.role is Role.USER:
            if pending is not None:
                out.append(Exchange(session.id, pending[0], None, pending[1]))
            pending = (turn.message, turn.index)
        elif pending is not None:
            out.append(Exchange(session.id, pending[0], turn.message, pending[1], turn.index))
            pending = None
        else:
            out.append(Exchange(session.id, None, turn.message, None, turn.index))
    if pending is not None:
        out.append(Exchange(session.id, pending[0], None, pending[1]))
    return out
