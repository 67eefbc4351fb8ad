"""MemoryPersistSystem (order 50): remember an answered turn, and retire old messages from the session.

1. Append the daily-note line and the turn's heuristic items (fast local appends). The items are in
   memory at once; their writes are left in ``turn.writes``, which the dispatcher awaits beside the
   session's save, before the reply is sent. They are fsynced within a second, not per message: the
   session holds the messages durably, and a start after a power cut records them again
   (bot/memory/lazy_sync.py).
2. When the session holds more than ``memory_window`` messages: archive the older ones, trim the
   session to the last ``keep_recent``, and consolidate the retired messages in the background, so the
   reply never waits for the model. ``memory_window = 0`` trims to the last 10 without consolidating.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

import structlog

from bot.config import MemorySettings
from bot.domain import Message, Role, new_id
from bot.memory import CONVERSATION_KEY, Exchange, MemoryService
from pipeline.base import Turn

log = structlog.get_logger(__name__)

PLAIN_TRIM_KEEP = 10
CONVERSATION_GAP = timedelta(hours=3)


def safe_cut(messages: Sequence[Message], cut: int) -> int:
    """Move ``cut`` back so the kept part never starts with tool results cut off from their call.

    Invariant: an assistant message with tool calls and its results stay on the same side.
    """
    cut = max(0, min(cut, len(messages)))
    while 0 < cut < len(messages) and messages[cut].role is Role.TOOL:
        cut -= 1
    return cut


def turn_user_messages(turn: Turn) -> list[Message]:
    """The user messages this turn answers: those just before the turn's first own message."""
    messages = turn.session.messages
    end = len(messages)
    if turn.new_messages:
        first = turn.new_messages[0]
        end = next((i for i, m in enumerate(messages) if m is first), len(messages))
    start = end
    while start > 0 and messages[start - 1].role is Role.USER:
        start -= 1
    return list(messages[start:end])


def conversation(turn: Turn, users: Sequence[Message]) -> str:
    """The conversation this turn belongs to: the one going on, or a new one after ``/new``, on a new
    session, or when the chat was quiet for ``CONVERSATION_GAP`` (people come back to a new topic).
    Its id is kept in the session's metadata."""
    session = turn.session
    cut = next((i for i, m in enumerate(session.messages) if users and m is users[0]), len(session.messages))
    earlier = [m for m in session.messages[:cut] if m.role is not Role.SYSTEM]
    current = session.metadata.get(CONVERSATION_KEY)
    quiet = not earlier or turn.now - earlier[-1].timestamp > CONVERSATION_GAP
    if quiet or not isinstance(current, str) or not current:
        current = session.metadata[CONVERSATION_KEY] = new_id()
    return current


class MemoryPersistSystem:
    name = "memory_persist"
    order = 50
    enabled = True

    def __init__(self, memory: MemoryService, settings: MemorySettings) -> None:
        self._memory = memory
        self._settings = settings

    def should_process(self, turn: Turn) -> bool:
        return turn.reply is not None

    async def process(self, turn: Turn) -> None:
        await self._remember(turn)
        await self._retire(turn)

    async def _remember(self, turn: Turn) -> None:
        users = turn_user_messages(turn)
        answer = next(
            (m for m in reversed(turn.new_messages) if m.role is Role.ASSISTANT and m.content.strip()), None
        )
        if answer is None and turn.reply:
            answer = Message(Role.ASSISTANT, turn.reply, timestamp=turn.clock())
        sid, talk = turn.session.id, conversation(turn, users)
        exchanges = [Exchange(sid, u, None, conversation=talk) for u in users[:-1]]
        exchanges.append(Exchange(sid, users[-1] if users else None, answer, conversation=talk))
        # Made from the session's messages, which its save makes durable: fsynced a moment later.
        record = self._memory.record_exchanges(exchanges, sync=False)
        turn.writes.append(asyncio.ensure_future(record))

    async def _retire(self, turn: Turn) -> None:
        session = turn.session
        window = self._settings.memory_window
        messages = session.messages
        keep = PLAIN_TRIM_KEEP if window == 0 else self._settings.keep_recent
        limit = PLAIN_TRIM_KEEP if window == 0 else window
        if len(messages) <= limit:
            return
        cut = safe_cut(messages, len(messages) - keep)
        if cut == 0:
            return
        retired = list(messages[:cut])
        # The full transcript is never lost: archive (and, to consolidate, record as pending) before
        # anything leaves the session.
        if window > 0:
            await self._memory.consolidate_in_background(session.id, retired)
        else:
            await self._memory.archive_messages(session.id, retired)
        session.replace_messages(messages[cut:])
        log.info("session_trimmed", session_id=session.id, retired=len(retired), kept=len(session.messages))
