"""Lanes: the items of one key handled one at a time in order, those of different keys side by side.

The Telegram hand-over (:mod:`channels.telegram.handover`) puts each held update in its chat's lane,
so a chat whose photo comes slowly from Telegram's file server holds back its own later messages (the
paste joiner and the dispatcher rely on their order) but no other chat's.

A fixed number of workers (``width``) take lanes in the order they were opened: a flood of chats spawns
no task, it waits. A lane exists only while it has items and is dropped when its last one is done, so
memory follows what waits, not how many chats were ever seen. What waits is bounded by the caller (the
hand-over puts only updates the journal holds, and the journal holds at most ``held_limit``).

``work`` may say its item must wait (it returns the seconds to wait: storage refused the item's intake,
say): the item stays first in its lane, the lane's later items behind it, and the worker goes on with
other lanes meanwhile; the lane is taken up again after the wait (``pause``, which may end it early: the
hand-over's ends when another chat's intake goes through, for storage is back then). Waiting in the
worker, ``width`` chats that wait for something only the operator can fix (an unreadable pairing.json)
held back every chat.

    lanes = Lanes(hand_over, width=8)
    lanes.put(chat_id, update)  # any time, also before run()
    await lanes.run()  # until cancelled; cancelling drops what was not done (in another task: idle())
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


Work = Callable[[T], Awaitable[float | None]]
"""Handles one item: ``None`` when it is done, or the seconds to wait before it is handed in again."""


class Lanes(Generic[K, T]):
    """``work`` applied to every item put, in order per key, at most ``width`` items at once."""

    def __init__(
        self, work: Work[T], *, width: int, pause: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> None:
        if width < 1:
            raise ValueError(f"width must be at least 1, not {width}")
        self._work = work
        self._width = width
        self._pause = pause
        self._lanes: dict[K, deque[T]] = {}  # only lanes with items: a key is in _ready or being worked
        self._ready: asyncio.Queue[K] = asyncio.Queue()
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        """Open lanes (keys with items not done yet)."""
        return len(self._lanes)

    def put(self, key: K, item: T) -> None:
        lane = self._lanes.get(key)
        if lane is not None:
            lane.append(item)  # behind the items of its key still waiting or being worked on
            return
        self._lanes[key] = deque([item])
        self._idle.clear()
        self._ready.put_nowait(key)

    async def idle(self) -> None:
        """Wait until every item put so far is done (needs :meth:`run` going)."""
        await self._idle.wait()

    async def run(self) -> None:
        """Work the lanes until cancelled (the items being worked on are cancelled too). ``work`` is to
        handle its own failures: one it raises ends ``run`` with it."""
        async with asyncio.TaskGroup() as workers:
            for _ in range(self._width):
                workers.create_task(self._worker(workers))

    async def _worker(self, group: asyncio.TaskGroup) -> None:
        while True:
            key = await self._ready.get()
            lane = self._lanes[key]
            wait = None
            while lane:
                wait = await self._work(lane[0])
                if wait is not None:  # the item stays first; its lane comes back after the wait
                    group.create_task(self._back_after(wait, key))
                    break
                lane.popleft()  # only now: an item put meanwhile found the lane open and waits behind it
            if wait is not None:
                continue
            del self._lanes[key]  # no await since the lane ran empty: nothing was put in between
            if not self._lanes:
                self._idle.set()

    async def _back_after(self, wait: float, key: K) -> None:
        await self._pause(wait)
        self._ready.put_nowait(key)
