"""One lock per chat, kept only while someone holds it or waits for it.

Channels take each chat's messages in one at a time, in arrival order (the dispatcher and the paste
joiner rely on it). A plain ``dict`` of locks did that and grew by one lock for every chat ever seen:
a bot open to the public (strangers' DMs, many servers) kept them all for as long as it ran. Here a
chat's lock is dropped when its last holder leaves, and made anew the next time.

    locks = ChatLocks()
    async with locks.hold(chat_id):  # FIFO among the holders of one chat, as asyncio.Lock is
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Entry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # holding it or waiting for it


class ChatLocks:
    """``hold(chat_id)``: that chat's lock, FIFO; a chat nobody holds or waits for costs nothing."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        """Chats whose lock is held or waited for."""
        return len(self._entries)

    @contextlib.asynccontextmanager
    async def hold(self, chat_id: str) -> AsyncIterator[None]:
        # Counted before the first await, so a caller that enters first is served first.
        entry = self._entries.get(chat_id)
        if entry is None:
            entry = self._entries[chat_id] = _Entry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[chat_id]
