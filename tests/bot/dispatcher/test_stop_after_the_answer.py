"""/stop or a shutdown once the answer is final (the model gave it): the history keeps what the chat gets.

The answer is in the session once the model gave it, and saved with the turn before it is sent (a crash
resends it, never asks again). A /stop that cancelled the turn from there on (the systems after the
model, the save, the send) marked its messages done: the chat never got the answer, or got part of it,
while the history held all of it, and the model went on believing it had answered. Now such a /stop
finds nothing to stop: the answer goes out, and the history holds what the chat was sent. A shutdown
that cuts such a turn saves the answer to be sent after the restart, as after a kill.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.dispatcher import Dispatcher
from bot.domain import OutboundMessage, Role
from bot.session_service import SessionService
from channels.base import InboundSink
from pipeline import Turn
from tests.bot.test_dispatcher import ModelSystem
from tests.bot.test_dispatcher_recovery import msg, pending, settled, started
from tests.recording import RecordingChannel

# What /stop says then: "Nothing is running." told the chat no answer was coming, while one was.
ON_ITS_WAY = "Nothing to stop: the answer is already on its way."


class SlowPlatform(RecordingChannel):
    """A platform that takes its time over an answer (a long one goes in pieces, a 5xx is retried), until
    ``release`` is set; a command's reply (an aside) goes at once."""

    def __init__(self, submit: InboundSink) -> None:
        super().__init__(submit)
        self.sending = asyncio.Event()
        self.release = asyncio.Event()

    async def send(self, message: OutboundMessage) -> None:
        if not message.aside:
            self.sending.set()
            await self.release.wait()
        await super().send(message)


async def answered_once_on_its_way(
    tmp_path: Path, dispatcher: Dispatcher, channel: RecordingChannel, sessions: SessionService
) -> None:
    """Once the held answer went on: the chat got it, the history holds exactly it, and /stop said it
    was on its way."""
    await dispatcher.settled("test:c1")
    await settled(tmp_path)
    session = await sessions.get("test:c1")
    await dispatcher.close(grace=1)

    delivered = [m.text for m in channel.sent if not m.aside]
    assert delivered == ["answer to hello"]
    assert session is not None
    assert [m.content for m in session.messages if m.role is Role.ASSISTANT] == delivered
    assert [m.text for m in channel.sent if m.aside] == [ON_ITS_WAY]


async def test_a_stop_while_the_answer_is_sent_leaves_it_to_arrive_and_in_the_history(
    tmp_path: Path,
) -> None:
    dispatcher, channel, sessions = await started(tmp_path, ModelSystem(), channel_type=SlowPlatform)
    assert isinstance(channel, SlowPlatform)
    await dispatcher.submit(msg("hello", message_id="1"))
    await channel.sending.wait()  # saved with the turn, and on its way
    await dispatcher.submit(msg("/stop", message_id="2"))
    channel.release.set()
    await answered_once_on_its_way(tmp_path, dispatcher, channel, sessions)
    assert await pending(tmp_path) == []


class AfterTheAnswer:
    """A system after the model's (memory's place): it holds the turn until ``release`` is set."""

    name, order, enabled = "after", 50, True

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    def should_process(self, turn: Turn) -> bool:
        return True

    async def process(self, turn: Turn) -> None:
        self.reached.set()
        await self.release.wait()


async def past_the_model(
    tmp_path: Path,
) -> tuple[Dispatcher, RecordingChannel, SessionService, AfterTheAnswer]:
    """A dispatcher whose turn for "hello" is held after the model answered (the session holds it),
    while memory's step runs."""
    after = AfterTheAnswer()
    dispatcher, channel, sessions = await started(tmp_path, ModelSystem(), after=(after,))
    await dispatcher.submit(msg("hello", message_id="1"))
    await after.reached.wait()
    return dispatcher, channel, sessions, after


async def test_a_stop_after_the_model_answered_leaves_the_answer_to_arrive(tmp_path: Path) -> None:
    dispatcher, channel, sessions, after = await past_the_model(tmp_path)
    await dispatcher.submit(msg("/stop", message_id="2"))
    after.release.set()
    await answered_once_on_its_way(tmp_path, dispatcher, channel, sessions)


async def test_a_shutdown_after_the_model_answered_sends_that_answer_after_the_restart(
    tmp_path: Path,
) -> None:
    """The grace period ends while the systems after the model run: the answer (in the history, and in
    memory) is saved to be sent, as a saved answer is after a kill. It was saved as an unanswered turn,
    and the next start asked the model again: the chat got a second answer, the history held both."""
    dispatcher, channel, _, _ = await past_the_model(tmp_path)
    await dispatcher.close(grace=0)  # the turn is cut where it is

    model = ModelSystem()
    restarted, channel2, sessions2 = await started(tmp_path, model)
    await channel2.wait_for(1)
    await settled(tmp_path)
    session = await sessions2.get("test:c1")
    await restarted.close(grace=1)

    delivered = [m.text for m in [*channel.sent, *channel2.sent] if not m.aside]
    assert delivered == ["answer to hello"] and model.seen == []
    assert session is not None
    assert [m.content for m in session.messages] == ["hello", "answer to hello"]
