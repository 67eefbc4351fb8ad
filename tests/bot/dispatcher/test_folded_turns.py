"""A turn that answers several messages (folded past the queue limit, or recovered together) stays one
turn in ``per_message`` mode when it is cut short: by a shutdown, then answered after the restart, or by
the model being out of reach, then tried again. Answered once per message, the chat got an answer per
message for what it was told is read together, and each answer saw all of them in the history.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.commands import CommandRouter
from bot.config import DispatcherSettings
from bot.dispatcher import Dispatcher
from bot.domain import Role
from bot.errors import LLMUnavailable
from bot.inbox import Inbox
from bot.session_service import SessionService
from bot.sessions import JsonSessionStore
from pipeline import Pipeline, Turn
from tests.bot.test_dispatcher import ModelSystem
from tests.bot.test_dispatcher_recovery import msg, pending, settled, started
from tests.recording import RecordingChannel

PER_MESSAGE = {"mode": "per_message", "queue_limit": 1}


async def folded_turn_running(tmp_path: Path) -> tuple[Dispatcher, ModelSystem]:
    """A per_message chat whose running turn answers "a" with "b" folded behind it, held at the model."""
    model = ModelSystem()
    model.gate = first = asyncio.Event()
    dispatcher, _, _ = await started(tmp_path, model, **PER_MESSAGE)
    await dispatcher.submit(msg("first", message_id="1"))
    await model.started.wait()
    await dispatcher.submit(msg("a", message_id="2"))
    await dispatcher.submit(msg("b", message_id="3"))  # past the queue limit: folded behind "a"
    model.started.clear()
    model.gate = asyncio.Event()  # the next turn is held (the running one waits on ``first``)
    first.set()
    await model.started.wait()
    return dispatcher, model


async def test_a_folded_turn_cut_by_a_shutdown_is_answered_once_after_the_restart(tmp_path: Path) -> None:
    dispatcher, model = await folded_turn_running(tmp_path)
    await dispatcher.close(grace=0)  # the turn on "a" and "b" is cut; both stay pending
    assert model.seen == ["first"] and await pending(tmp_path) == ["a", "b"]

    model2 = ModelSystem()
    restarted, channel2, sessions = await started(tmp_path, model2, **PER_MESSAGE)
    await channel2.wait_for(1)
    await settled(tmp_path)
    await restarted.settled("test:c1")
    session = await sessions.get("test:c1")
    await restarted.close(grace=1)

    assert model2.seen == ["a\n\nb"]
    assert [m.text for m in channel2.sent] == ["answer to a\n\nb"]
    assert session is not None
    assert [m.content for m in session.messages if m.role is Role.USER] == ["first", "a", "b"]


class DownOnce(ModelSystem):
    """The model is out of reach for the first try of the turn on ``down_for``, then answers."""

    def __init__(self, down_for: str) -> None:
        super().__init__()
        self.down_for = down_for
        self.tries: list[str] = []

    async def process(self, turn: Turn) -> None:
        self.tries.append(turn.user_text)
        if turn.user_text == self.down_for and self.tries.count(self.down_for) == 1:
            raise LLMUnavailable("503 from the provider")
        await super().process(turn)


async def test_a_folded_turn_that_waited_for_the_model_is_tried_again_as_one_turn(tmp_path: Path) -> None:
    model = DownOnce(down_for="a\n\nb")
    model.gate = first = asyncio.Event()
    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
    settings = DispatcherSettings(
        mode="per_message", queue_limit=1, model_retry_first=0.01, model_retry_max=0.01
    )
    dispatcher = Dispatcher(
        Pipeline([model]), sessions, CommandRouter(), settings, inbox=Inbox(tmp_path / "inbox")
    )
    channel = RecordingChannel(dispatcher.submit)
    await dispatcher.recover()
    dispatcher.attach(channel)
    await dispatcher.submit(msg("first", message_id="1"))
    await model.started.wait()
    await dispatcher.submit(msg("a", message_id="2"))
    await dispatcher.submit(msg("b", message_id="3"))  # folded behind "a"
    first.set()
    await settled(tmp_path)
    await dispatcher.settled("test:c1")
    await dispatcher.close(grace=1)

    assert model.tries == ["first", "a\n\nb", "a\n\nb"]  # the failed try, then the same turn again
    answers = [m.text for m in channel.sent if not m.aside]
    assert answers == ["answer to first", "answer to a\n\nb"]
