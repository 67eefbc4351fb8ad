"""Sessions in a bounded in-memory cache in front of their store (``bot/sessions.py``), the one way the
rest of membot gets, saves and drops them."""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from datetime import datetime

from bot.domain import Session, session_id
from bot.outbox import PendingReply
from bot.sessions import SessionStore


class SessionService:
    """The one way the rest of membot gets, saves and drops sessions.

    Keeps at most ``cache_size`` sessions in memory (least recently used leave first). A session that is
    leased (a turn or command is working on it) is never evicted, so there is never a second copy of a
    live session; an evicted one is simply read back from disk when needed.

    Only the sessions nobody leases are candidates (``_idle``, least recently used first), so making room
    costs the sessions evicted, not a walk past every leased one: with more chats in turns at once than
    ``cache_size``, that walk was made at every lease's end.
    """

    def __init__(self, store: SessionStore, *, cache_size: int = 256) -> None:
        self._store = store
        self._cache_size = cache_size
        self._cache: dict[str, Session] = {}  # (eviction follows ``_idle``'s order)
        self._leases: dict[str, int] = {}
        self._idle: OrderedDict[str, None] = OrderedDict()  # cached and not leased, LRU first
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def store(self) -> SessionStore:
        return self._store

    @property
    def cached(self) -> int:
        return len(self._cache)

    def _lock(self, sid: str) -> asyncio.Lock:
        lock = self._locks.get(sid)
        if lock is None:
            lock = self._locks[sid] = asyncio.Lock()
        return lock

    async def get(self, sid: str) -> Session | None:
        """The session if it exists (in memory or on disk), without creating it."""
        if sid in self._cache:
            if sid in self._idle:
                self._idle.move_to_end(sid)
            return self._cache[sid]
        async with self._lock(sid):
            if sid in self._cache:
                return self._cache[sid]
            session = await self._store.load(sid)
            if session is not None:
                self._remember(session)
            return session

    async def get_or_create(self, channel: str, chat: str) -> Session:
        sid = session_id(channel, chat)
        session = await self.get(sid)
        if session is None:
            session = Session.new(channel, chat)
            self._remember(session)
        return session

    @contextlib.asynccontextmanager
    async def lease(self, channel: str, chat: str) -> AsyncIterator[Session]:
        """Hold a session in memory while working on it (it cannot be evicted meanwhile).

        Held from before it is read or made: a new session made while every other one was leased was
        evicted at once, and a second lease then made a second copy of it."""
        sid = session_id(channel, chat)
        self._leases[sid] = self._leases.get(sid, 0) + 1
        self._idle.pop(sid, None)
        try:
            yield await self.get_or_create(channel, chat)
        finally:
            left = self._leases[sid] - 1
            if left:
                self._leases[sid] = left
            else:
                del self._leases[sid]
                if sid in self._cache:
                    self._idle[sid] = None
                self._evict()

    async def save(self, session: Session, *, replies: Sequence[PendingReply] = ()) -> None:
        """Save ``session``; ``replies`` are stored in the same write (see bot/outbox.py)."""
        async with self._lock(session.id):
            await self._store.save(session, replies=replies)
        if session.id not in self._cache:
            self._remember(session)

    async def save_if_idle(self, session: Session) -> None:
        """Save ``session`` if it changed and nobody leases it (a lessee saves it with its own work).

        For a change made outside a lease, as a command's note is (bot/intake.py): saved while a turn
        runs, it would store that turn half done. A copy the cache no longer holds is not saved, as
        the one read back from disk since may be ahead of it."""
        async with self._lock(session.id):
            if self._cache.get(session.id) is session and session.id not in self._leases and session.unsaved:
                await self._store.save(session)

    async def delete(self, sid: str) -> bool:
        async with self._lock(sid):
            self._cache.pop(sid, None)
            self._idle.pop(sid, None)
            return await self._store.delete(sid)

    async def clear_messages(self, session: Session) -> None:
        session.replace_messages([])
        await self.save(session)

    async def message_count(self, sid: str) -> int:
        session = await self.get(sid)
        return len(session.messages) if session else 0

    async def list_ids(self) -> list[str]:
        return await self._store.list_ids()

    async def changed_since(self, when: datetime) -> list[str]:
        return await self._store.changed_since(when)

    async def replies(self, sid: str) -> list[PendingReply]:
        return await self._store.replies(sid)

    def cached_sessions(self) -> list[Session]:
        return list(self._cache.values())

    def _remember(self, session: Session) -> None:
        self._cache[session.id] = session
        if session.id not in self._leases:
            self._idle[session.id] = None
            self._idle.move_to_end(session.id)
        self._evict()

    def _evict(self) -> None:
        looked = 0  # an unsaved session stays, and goes to the back: each is passed over once per call
        while len(self._cache) > self._cache_size and looked < len(self._idle):
            sid = next(iter(self._idle))
            session = self._cache[sid]
            if session.unsaved:
                self._idle.move_to_end(sid)
                looked += 1
                continue
            del self._idle[sid]
            del self._cache[sid]
            lock = self._locks.get(sid)
            if lock is not None and not lock.locked():
                del self._locks[sid]
