"""ChatLocks: each chat's holders in order, chats apart, and no lock left for a chat nobody holds."""

from __future__ import annotations

import asyncio

from channels.chat_locks import ChatLocks


async def test_holders_of_one_chat_go_in_the_order_they_came_and_other_chats_do_not_wait() -> None:
    locks = ChatLocks()
    order: list[str] = []
    release = asyncio.Event()

    async def holder(chat: str, name: str, wait: bool = False) -> None:
        async with locks.hold(chat):
            order.append(name)
            if wait:
                await release.wait()

    first = asyncio.create_task(holder("a", "a1", wait=True))
    await asyncio.sleep(0)
    queued = [asyncio.create_task(holder("a", f"a{n}")) for n in (2, 3)]
    await holder("b", "b1")  # another chat: not behind a1
    assert order == ["a1", "b1"]
    release.set()
    await asyncio.gather(first, *queued)
    assert order == ["a1", "b1", "a2", "a3"]
    assert len(locks) == 0


async def test_a_lock_is_dropped_when_its_last_holder_leaves_even_by_a_cancel_or_an_error() -> None:
    locks = ChatLocks()
    for n in range(1000):  # chats seen once each
        async with locks.hold(f"chat{n}"):
            pass
    assert len(locks) == 0

    release = asyncio.Event()

    async def hold_until_released() -> None:
        async with locks.hold("a"):
            await release.wait()

    holding = asyncio.create_task(hold_until_released())
    await asyncio.sleep(0)
    waiting = asyncio.create_task(hold_until_released())
    await asyncio.sleep(0)
    assert len(locks) == 1
    waiting.cancel()  # cancelled while it waits for the lock
    await asyncio.gather(waiting, return_exceptions=True)
    assert len(locks) == 1  # still held by the first
    release.set()
    await holding
    assert len(locks) == 0

    try:
        async with locks.hold("b"):
            raise ValueError("a failed submit")
    except ValueError:
        pass
    assert len(locks) == 0
