"""Lanes: one key's items in order, other keys past a blocked one, never more than ``width`` at once, and
nothing kept of a key once its items are done."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from channels.telegram.lanes import Lanes


class Gates:
    """Work that records each item as it starts and finishes, and waits for its gate when it has one."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.started: list[str] = []
        self.done: list[str] = []
        self.running = 0
        self.most_running = 0

    def gate(self, item: str) -> asyncio.Event:
        return self.gates.setdefault(item, asyncio.Event())

    async def work(self, item: str) -> None:
        self.started.append(item)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            if item in self.gates:
                await self.gates[item].wait()
            self.done.append(item)
        finally:
            self.running -= 1


@contextlib.asynccontextmanager
async def running(lanes: Lanes[str, str]) -> AsyncIterator[None]:
    task = asyncio.create_task(lanes.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_blocked_item_holds_back_its_own_key_only() -> None:
    gates = Gates()
    lanes: Lanes[str, str] = Lanes(gates.work, width=4)
    slow = gates.gate("a1")
    async with running(lanes):
        lanes.put("a", "a1")
        lanes.put("a", "a2")
        lanes.put("b", "b1")
        lanes.put("b", "b2")
        await settle()
        assert gates.done == ["b1", "b2"] and gates.started == ["a1", "b1", "b2"]  # a2 waits behind a1
        slow.set()
        await lanes.idle()
    assert gates.done == ["b1", "b2", "a1", "a2"]


async def test_no_more_than_width_items_run_at_once_and_the_rest_wait_their_turn() -> None:
    gates = Gates()
    lanes: Lanes[str, str] = Lanes(gates.work, width=2)
    for key in "abcde":
        gates.gate(key)
        lanes.put(key, key)
    async with running(lanes):
        await settle()
        assert gates.started == ["a", "b"]  # the lanes in the order they opened
        gates.gates["b"].set()
        await settle()
        assert gates.started == ["a", "b", "c"]
        for gate in gates.gates.values():
            gate.set()
        await lanes.idle()
    assert gates.most_running == 2 and sorted(gates.done) == list("abcde")


async def test_a_lane_is_dropped_once_its_items_are_done() -> None:
    gates = Gates()
    lanes: Lanes[str, str] = Lanes(gates.work, width=3)
    async with running(lanes):
        for n in range(1000):  # a thousand chats, each seen once
            lanes.put(f"chat{n}", f"m{n}")
        assert len(lanes) == 1000
        await lanes.idle()
        assert len(lanes) == 0 and len(gates.done) == 1000
        lanes.put("chat7", "again")  # a key seen before opens a fresh lane
        await lanes.idle()
    assert gates.done[-1] == "again" and len(lanes) == 0


async def test_cancelling_run_cancels_the_items_being_worked_on() -> None:
    gates = Gates()
    lanes: Lanes[str, str] = Lanes(gates.work, width=2)
    gates.gate("a1")
    lanes.put("a", "a1")
    lanes.put("a", "a2")
    async with running(lanes):
        await settle()
        assert gates.running == 1
    assert gates.running == 0 and gates.done == []  # neither a1 nor a2 done: the caller keeps them


async def test_an_item_that_must_wait_gives_its_worker_to_other_keys_and_keeps_its_place() -> None:
    """One worker: ``a1`` says "again in a moment" until it can be done; meanwhile ``b`` is worked on,
    ``a2`` waits behind ``a1``, and ``a1`` is handed in again, in order, once its wait is over."""
    ready = asyncio.Event()
    tries: list[str] = []
    done: list[str] = []

    async def work(item: str) -> float | None:
        tries.append(item)
        if item == "a1" and not ready.is_set():
            return 0.0
        done.append(item)
        return None

    lanes: Lanes[str, str] = Lanes(work, width=1)
    async with running(lanes):
        lanes.put("a", "a1")
        lanes.put("a", "a2")
        lanes.put("b", "b1")
        await settle()
        assert "b1" in done and "a2" not in tries  # the only worker was free for b; a2 stays behind a1
        ready.set()
        await lanes.idle()
    assert done == ["b1", "a1", "a2"]
