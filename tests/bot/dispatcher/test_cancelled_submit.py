"""A hand-over cancelled once its message is in the inbox still gets that message answered, once.

A channel may give up a ``submit`` half way: the Discord channel cancels its catch-up when a new gateway
session replaces the one it read for (the connection dropped and could not be resumed), and reads the
chats again. A cancel that reached ``submit`` while the inbox line was being written left the message
half taken. Cancelled before the write's task ran, the message stayed pending in the inbox but in no
chat's lane: nothing answered it, and its redelivery (the catch-up reading it again) was ignored as
known, so the chat waited for the next restart. Cancelled during the write, the inbox forgot the entry
while the line still reached the disk: the redelivery was answered as new, and a start after a kill
answered the forgotten line again. Now a message the inbox took is queued before the cancel goes on.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.dispatcher import Dispatcher
from bot.domain import InboundMessage
from pipeline import Turn
from tests.bot.test_dispatcher import ModelSystem
from tests.bot.test_dispatcher_recovery import msg, started


class HoldsOne(ModelSystem):
    """Answers every message at once but ``held``, whose turn runs until the shutdown cuts it."""

    def __init__(self, held: str) -> None:
        super().__init__()
        self.held = held
        self.holding = asyncio.Event()

    async def process(self, turn: Turn) -> None:
        if turn.user_text == self.held:
            self.holding.set()
            await asyncio.Event().wait()
        await super().process(turn)


async def cancelled_once_in_the_inbox(dispatcher: Dispatcher, message: InboundMessage, *, steps: int) -> None:
    """``submit(message)``, cancelled once the inbox holds it, ``steps`` loop turns later (0: before
    the task that writes its line ran; 1: while that task waits for the line to be written)."""
    taking = asyncio.create_task(dispatcher.submit(message))
    inbox = dispatcher._inbox
    assert inbox is not None and message.message_id is not None
    while not inbox.holds(message.session_id, message.message_id):
        await asyncio.sleep(0)
    for _ in range(steps):
        await asyncio.sleep(0)
    taking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await taking


@pytest.mark.parametrize("steps", [0, 1], ids=["before-the-write", "during-the-write"])
async def test_a_message_whose_hand_over_was_cancelled_is_answered_once(tmp_path: Path, steps: int) -> None:
    model = HoldsOne(held="later")
    dispatcher, channel, _ = await started(tmp_path, model)
    await cancelled_once_in_the_inbox(dispatcher, msg("hi", message_id="101"), steps=steps)
    await dispatcher.submit(msg("hi", message_id="101"))  # the channel hands it over again
    await channel.wait_for(1)
    await dispatcher.submit(msg("later", message_id="102"))  # pending at the stop: the inbox file stays
    await model.holding.wait()
    await dispatcher.close(grace=0.05)
    assert [m.text for m in channel.sent] == ["answer to hi"]
    assert model.seen == ["hi"]

    model2 = ModelSystem()
    restarted, channel2, _ = await started(tmp_path, model2)
    await channel2.wait_for(1)
    await restarted.settled("test:c1")
    await restarted.close(grace=1)
    assert [m.text for m in channel2.sent] == ["answer to later"]  # not "hi" a second time
    assert model2.seen == ["later"]


async def test_an_overflow_whose_hand_over_was_cancelled_still_gets_the_chat_told(tmp_path: Path) -> None:
    """The hand-over that found the chat's queue full and owed it the "I'm still on your earlier
    messages" notice was cancelled: the notice was dropped unsent (a coroutine never awaited) and the
    lane marked as told, so the chat never heard it. Now the next message of the flood says it."""
    model = ModelSystem()
    model.gate = asyncio.Event()
    dispatcher, channel, _ = await started(tmp_path, model, queue_limit=1)
    await dispatcher.submit(msg("running", message_id="1"))
    await model.started.wait()
    await dispatcher.submit(msg("queued", message_id="2"))
    await cancelled_once_in_the_inbox(dispatcher, msg("over", message_id="3"), steps=1)
    await dispatcher.submit(msg("over again", message_id="4"))
    [notice] = await channel.wait_for(1)
    model.gate.set()
    await dispatcher.settled("test:c1")
    await dispatcher.close(grace=1)
    assert notice.text.startswith("I'm still on your earlier messages")
