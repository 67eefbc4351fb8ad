"""The dispatcher's side of the durable path, in-process: outbox, /stop, redeliveries, stale messages,
readiness, shutdown intake, and the inbox journal that records it all.

A "restart" is a second dispatcher built over the same workspace, as a new process would build it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot import intake
from bot.commands import CommandCall, CommandRouter, SessionControl
from bot.config import DispatcherSettings
from bot.dispatcher import Dispatcher
from bot.domain import InboundMessage, OutboundMessage, Role, utcnow
from bot.errors import ChannelError, ChannelRefused, LLMUnavailable
from bot.inbox import COMPACT_AFTER, Inbox
from bot.retry import Backoff
from bot.session_service import SessionService
from bot.sessions import JsonSessionStore
from channels.base import InboundSink
from pipeline import Pipeline
from tests.bot.test_dispatcher import ModelSystem
from tests.channels.telegram.kit import break_folder
from tests.recording import RecordingChannel


class DownChannel(RecordingChannel):
    """A channel whose platform refuses every send (after its own retries), as a real one raises."""

    def __init__(self, submit: InboundSink) -> None:
        super().__init__(submit)
        self.attempts: list[OutboundMessage] = []

    async def send(self, message: OutboundMessage) -> None:
        self.attempts.append(message)
        raise ChannelError("could not deliver a reply: Bad Gateway")


class FlakyChannel(RecordingChannel):
    """A platform that refuses the first ``failures`` sends (an outage past the channel's retries)."""

    def __init__(self, submit: InboundSink, failures: int = 3) -> None:
        super().__init__(submit)
        self.failures = failures
        self.attempts: list[OutboundMessage] = []

    async def send(self, message: OutboundMessage) -> None:
        self.attempts.append(message)
        if len(self.attempts) <= self.failures:
            raise ChannelError("could not deliver a reply: Bad Gateway")
        await super().send(message)


class BlockedChannel(RecordingChannel):
    """A platform that fails once (an outage), then refuses the chat for good (the user blocked the bot)."""

    def __init__(self, submit: InboundSink) -> None:
        super().__init__(submit)
        self.attempts: list[OutboundMessage] = []

    async def send(self, message: OutboundMessage) -> None:
        self.attempts.append(message)
        if len(self.attempts) == 1:
            raise ChannelError("could not deliver a reply: Bad Gateway")
        raise ChannelRefused(
            "could not deliver a reply: Forbidden: bot was blocked by the user",
            reason="the user blocked the bot",
            fix="only the user can unblock the bot",
        )


QUICK = Backoff(0.01, 0.05)  # the dispatcher's pauses before sending or writing again, for tests


def build(
    tmp_path: Path,
    model: ModelSystem,
    channel_type: type[RecordingChannel] = RecordingChannel,
    *,
    send_patience: float = 5.0,
    after: tuple[Any, ...] = (),
    cache_size: int | None = None,
    clock: Callable[[], datetime] = utcnow,
    **settings: object,
) -> tuple[Dispatcher, RecordingChannel, SessionService]:
    """``after``: systems after the model's; ``cache_size``: the session cache's (its default if None);
    ``clock``: the machine's."""
    store = JsonSessionStore(tmp_path / "sessions")
    sessions = SessionService(store) if cache_size is None else SessionService(store, cache_size=cache_size)
    dispatcher = Dispatcher(
        Pipeline([model, *after]),
        sessions,
        CommandRouter(),
        DispatcherSettings(**settings),  # type: ignore[arg-type]
        inbox=Inbox(tmp_path / "inbox"),
        retry=QUICK,
        send_patience=send_patience,
        clock=clock,
    )
    channel = channel_type(dispatcher.submit)
    return dispatcher, channel, sessions


async def started(
    tmp_path: Path, model: ModelSystem, **settings: object
) -> tuple[Dispatcher, RecordingChannel, SessionService]:
    """Built, recovered and attached, in the order `membot run` does it."""
    dispatcher, channel, sessions = build(tmp_path, model, **settings)
    await dispatcher.recover()
    dispatcher.attach(channel)
    return dispatcher, channel, sessions


def msg(text: str, *, message_id: str | None = None, chat: str = "c1") -> InboundMessage:
    return InboundMessage(channel="test", chat_id=chat, sender_id="u1", text=text, message_id=message_id)


async def settled(tmp_path: Path, *, kept: int = 0) -> None:
    """Until the inbox on disk holds nothing pending but ``kept`` answers that could not be sent."""
    async with asyncio.timeout(10):
        while True:
            inbox = Inbox(tmp_path / "inbox")
            entries = await inbox.load_pending()
            replies = {r.id for e in entries for r in inbox.kept_replies(e.message.session_id)}
            if len(replies) == kept and (kept or not entries):
                return
            await asyncio.sleep(0.01)


async def pending(tmp_path: Path) -> list[str]:
    return [e.message.text for e in await Inbox(tmp_path / "inbox").load_pending()]


async def test_an_answer_the_platform_refused_is_sent_on_the_next_start_without_asking_again(
    tmp_path: Path,
) -> None:
    model = ModelSystem()
    dispatcher, down, _ = build(tmp_path, model, DownChannel, send_patience=0.2)
    await dispatcher.recover()
    dispatcher.attach(down)
    await dispatcher.submit(msg("hello"))
    await settled(tmp_path, kept=1)
    async with asyncio.timeout(5):  # sent again while the patience lasts, then left to the next start
        while dispatcher.is_running("test:c1") or len(down.attempts) < 3:  # type: ignore[attr-defined]
            await asyncio.sleep(0.01)
    await dispatcher.close(grace=1)
    assert await pending(tmp_path) == ["hello"]  # not delivered: still pending
    model2 = ModelSystem()
    _, channel, sessions = await started(tmp_path, model2)
    [sent] = await channel.wait_for(1)
    assert sent.text == "answer to hello"
    assert model2.seen == []  # the saved answer went out; the model was not asked again
    await settled(tmp_path)
    session = await sessions.get("test:c1")
    assert session is not None and [m.content for m in session.messages] == ["hello", "answer to hello"]


async def test_answers_kept_across_a_step_back_of_the_clock_are_sent_again_in_the_order_asked(
    tmp_path: Path,
) -> None:
    """The next start sent kept answers again by their dates, the machine's clock: stepped back between
    two answers (an NTP correction), the second went out before the first."""
    clock = [utcnow()]
    model = ModelSystem()
    dispatcher, down, _ = build(tmp_path, model, DownChannel, send_patience=0.2, clock=lambda: clock[0])
    await dispatcher.recover()
    dispatcher.attach(down)
    await dispatcher.submit(msg("first"))
    await settled(tmp_path, kept=1)
    clock[0] -= timedelta(minutes=10)
    await dispatcher.submit(msg("second"))
    await settled(tmp_path, kept=2)
    await dispatcher.close(grace=1)

    model2 = ModelSystem()
    _, channel, _ = await started(tmp_path, model2)

    assert [m.text for m in await channel.wait_for(2)] == ["answer to first", "answer to second"]
    assert model2.seen == []


async def test_an_answer_refused_during_an_outage_is_sent_when_it_ends_and_before_the_next_one(
    tmp_path: Path,
) -> None:
    """It used to wait in the inbox for the next start (days, maybe), then arrive after later answers."""
    model = ModelSystem()
    dispatcher, flaky, _ = build(tmp_path, model, FlakyChannel)
    await dispatcher.recover()
    dispatcher.attach(flaky)
    await dispatcher.submit(msg("first"))
    await dispatcher.submit(msg("second"))
    sent = await flaky.wait_for(2)
    await settled(tmp_path)
    assert [m.text for m in sent] == ["answer to first", "answer to second"]
    assert [m.text for m in flaky.attempts].count("answer to first") == 4  # 3 refused, then sent once
    assert model.seen == ["first", "second"]


async def test_a_refusal_for_good_ends_the_wait_for_an_outage_to_pass(tmp_path: Path) -> None:
    dispatcher, blocked, _ = build(tmp_path, ModelSystem(), BlockedChannel, send_patience=3600)
    await dispatcher.recover()
    dispatcher.attach(blocked)
    await dispatcher.submit(msg("hello"))
    async with asyncio.timeout(5):
        await dispatcher.settled("test:c1")
    assert len(blocked.attempts) == 2  # the outage, then the refusal: no more tries for an hour
    await dispatcher.close(grace=1)
    assert await pending(tmp_path) == ["hello"]  # kept: the next start tries it once more


async def test_a_shutdown_does_not_wait_for_an_answer_being_sent_again(tmp_path: Path) -> None:
    dispatcher, down, _ = build(tmp_path, ModelSystem(), DownChannel, send_patience=3600)
    await dispatcher.recover()
    dispatcher.attach(down)
    await dispatcher.submit(msg("hello"))
    await settled(tmp_path, kept=1)
    started_at = asyncio.get_running_loop().time()
    await dispatcher.close(grace=10)
    assert asyncio.get_running_loop().time() - started_at < 1.0
    assert await pending(tmp_path) == ["hello"]  # kept: the next start sends it


async def test_a_save_the_disk_refuses_is_written_when_it_can_and_answered_once(tmp_path: Path) -> None:
    """A full disk at the save lost the answer until a restart, which then asked the model again."""
    model = ModelSystem()
    model.gate = asyncio.Event()
    dispatcher, channel, _ = await started(tmp_path, model)
    await dispatcher.submit(msg("hello"))
    await model.started.wait()
    folder = tmp_path / "sessions"
    assert not folder.exists()  # made by the first save
    folder.write_text("")  # where the sessions go cannot be a folder now: every save fails
    model.gate.set()
    [notice] = await channel.wait_for(1)
    await asyncio.sleep(0.2)
    assert "cannot save our conversation right now" in notice.text and notice.aside
    assert len(channel.sent) == 1  # the answer itself is never sent before it is on disk
    folder.unlink()  # space is back
    sent = (await channel.wait_for(2))[1]
    await settled(tmp_path)
    assert sent.text == "answer to hello" and model.seen == ["hello"]
    await dispatcher.close(grace=1)
    stored = await JsonSessionStore(folder).load("test:c1")
    assert stored is not None and [m.content for m in stored.messages] == ["hello", "answer to hello"]


async def test_stop_finishes_the_stopped_and_kept_messages(tmp_path: Path) -> None:
    model = ModelSystem()
    model.gate = asyncio.Event()
    dispatcher, channel, _ = await started(tmp_path, model)
    await dispatcher.submit(msg("hang"))
    await asyncio.sleep(0.01)
    await dispatcher.submit(msg("queued"))
    await dispatcher.submit(msg("/stop"))
    await channel.wait_for(1)
    assert await pending(tmp_path) == []  # the user asked: nothing to answer after a restart
    model.gate.set()


async def test_a_redelivered_platform_message_is_answered_once(tmp_path: Path) -> None:
    model = ModelSystem()
    model.gate = asyncio.Event()
    dispatcher, channel, _ = await started(tmp_path, model)
    await dispatcher.submit(msg("hi", message_id="101"))
    await dispatcher.submit(msg("hi", message_id="101"))  # still pending
    model.gate.set()
    await channel.wait_for(1)
    await settled(tmp_path)
    await dispatcher.submit(msg("hi", message_id="101"))  # answered already
    await dispatcher.submit(msg("new", message_id="102"))
    await channel.wait_for(2)
    await settled(tmp_path)
    # After a restart, Telegram sends the unconfirmed updates again.
    model2 = ModelSystem()
    dispatcher2, channel2, _ = await started(tmp_path, model2)
    await dispatcher2.submit(msg("new", message_id="102"))
    await asyncio.sleep(0.05)
    assert [m.text for m in channel.sent] == ["answer to hi", "answer to new"]
    assert model.seen == ["hi", "new"] and model2.seen == [] and channel2.sent == []


async def test_a_long_stale_message_is_acknowledged_as_skipped_not_answered(tmp_path: Path) -> None:
    earlier = Inbox(tmp_path / "inbox", clock=lambda: utcnow() - timedelta(hours=7))
    await earlier.load_pending()
    _, written = earlier.add(msg("what is the weather now?"))  # accepted 7 h ago, then the crash
    await written
    model = ModelSystem()
    _, channel, _ = await started(tmp_path, model, recover_max_age=6 * 3600)
    [sent] = await channel.wait_for(1)
    assert "did not answer your message" in sent.text and "what is the weather now?" in sent.text
    assert model.seen == []
    await settled(tmp_path)
    assert await pending(tmp_path) == []


async def test_an_inbox_line_whose_times_have_no_zone_is_still_answered(tmp_path: Path) -> None:
    """Edited by hand (or written by another tool): the times are taken as UTC. One such line stopped
    every start (a naive time compared with an aware one)."""
    inbox = Inbox(tmp_path / "inbox")
    await inbox.load_pending()
    _, written = inbox.add(msg("still answered?", message_id="1"))
    await written
    (path,) = (tmp_path / "inbox").glob("*.jsonl")
    record = json.loads(path.read_text())
    record["at"] = utcnow().replace(tzinfo=None).isoformat()
    record["message"]["ts"] = record["at"]
    path.write_text(json.dumps(record) + "\n")
    model = ModelSystem()

    _, channel, _ = await started(tmp_path, model, recover_max_age=6 * 3600)

    assert [m.text for m in await channel.wait_for(1)] == ["answer to still answered?"]


async def test_recovered_work_waits_for_its_channel_and_comes_before_new_messages(tmp_path: Path) -> None:
    model = ModelSystem()
    model.gate = asyncio.Event()
    dispatcher, _, _ = await started(tmp_path, model)
    await dispatcher.submit(msg("from before"))  # in flight when the process "dies"
    model2 = ModelSystem()
    dispatcher2, channel2, _ = build(tmp_path, model2, mode="per_message")
    await dispatcher2.recover()
    dispatcher2.attach(channel2, ready=False)
    await dispatcher2.submit(msg("after the restart"))
    await asyncio.sleep(0.05)
    assert channel2.sent == [] and model2.seen == []  # the channel is not up yet
    dispatcher2.ready("test")
    await channel2.wait_for(2)
    assert model2.seen == ["from before", "after the restart"]
    await dispatcher.close(0)


async def test_messages_arriving_during_shutdown_are_kept_for_the_next_start(tmp_path: Path) -> None:
    model = ModelSystem()
    model.gate = asyncio.Event()
    dispatcher, channel, _ = await started(tmp_path, model)
    await dispatcher.submit(msg("running"))
    closing = asyncio.create_task(dispatcher.close(5))
    await asyncio.sleep(0.01)
    await dispatcher.submit(msg("during the shutdown", chat="c2"))
    model.gate.set()
    await closing
    assert any("I'll answer this as soon as I'm back" in m.text for m in channel.sent)
    assert await pending(tmp_path) == ["during the shutdown"]
    model2 = ModelSystem()
    _, channel2, sessions2 = await started(tmp_path, model2)
    [sent] = await channel2.wait_for(1)
    assert sent.text == "answer to during the shutdown" and sent.chat_id == "c2"
    session = await sessions2.get("test:c2")
    assert session is not None and [m.role for m in session.messages] == [Role.USER, Role.ASSISTANT]


async def test_the_inbox_file_is_emptied_when_nothing_is_pending_and_compacted_when_busy(
    tmp_path: Path,
) -> None:
    inbox = Inbox(tmp_path / "inbox")
    await inbox.load_pending()
    path = tmp_path / "inbox" / "test:c1.jsonl"
    ids = []
    for i in range(3):
        entry_id, written = inbox.add(msg(f"m{i}"))
        await written
        ids.append(entry_id)
    await inbox.finish("test:c1", {ids[0]}, reply="r0")
    assert [e.message.text for e in await Inbox(tmp_path / "inbox").load_pending()] == ["m1", "m2"]
    await inbox.finish("test:c1", set(ids[1:]))
    assert path.stat().st_size == 0  # nothing pending: cut, kept as an empty file
    keep_id, written = inbox.add(msg("a chat that never pauses"))
    await written
    for i in range(COMPACT_AFTER):
        entry_id, written = inbox.add(msg(f"busy {i}"))
        await written
        await inbox.finish("test:c1", {entry_id})
    assert len(path.read_text().splitlines()) < COMPACT_AFTER  # rewritten with what is pending
    assert [e.entry_id for e in await Inbox(tmp_path / "inbox").load_pending()] == [keep_id]


async def test_a_waiting_command_redelivered_after_a_crash_runs_once(tmp_path: Path) -> None:
    """A /new kept while it waited for a turn, then cut by the stop: the platform hands it over again
    after the restart (its confirmation was lost with the process), and it still runs once, in its place."""
    ran: list[str] = []

    async def new(call: CommandCall, control: SessionControl) -> str:
        async with control.exclusive(call.session_id):
            ran.append(call.message.text)
            return "Session cleared."

    def dispatcher_on(model: ModelSystem) -> tuple[Dispatcher, RecordingChannel]:
        router = CommandRouter()
        router.add("new", "Start a fresh conversation", new)
        sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
        inbox = Inbox(tmp_path / "inbox")
        dispatcher = Dispatcher(Pipeline([model]), sessions, router, DispatcherSettings(), inbox=inbox)
        return dispatcher, RecordingChannel(dispatcher.submit)

    model = ModelSystem()
    model.gate = asyncio.Event()  # the turn never ends
    before, channel = dispatcher_on(model)
    await before.recover()
    before.attach(channel)
    await before.submit(msg("question", message_id="1"))
    await model.started.wait()
    await before.submit(msg("/new", message_id="2"))  # returns once it waits (kept in the inbox)
    await before.close(grace=0)
    assert ran == [] and await pending(tmp_path) == ["question", "/new"]
    after, channel = dispatcher_on(ModelSystem())
    assert await after.recover() == 2
    after.attach(channel)
    await after.submit(msg("/new", message_id="2"))  # the redelivery: ignored
    await after.submit(msg("/new", message_id="3"))  # a new one: runs too, after the question
    await settled(tmp_path)
    await asyncio.sleep(0.1)
    assert ran == ["/new", "/new"]
    answers = [m.text for m in channel.sent if not m.text.startswith("⏳")]  # ("3" may wait for the turn)
    assert answers == ["answer to question", "Session cleared.", "Session cleared."]
    await after.close(grace=1)


async def test_a_stop_sent_right_after_a_message_keeps_that_message(tmp_path: Path) -> None:
    """The turn is stopped before it stored its message: /stop's bookkeeping stores it, unanswered."""
    model = ModelSystem()
    model.gate = asyncio.Event()
    dispatcher, channel, sessions = await started(tmp_path, model)
    await dispatcher.submit(msg("hello", message_id="1"))
    await dispatcher.submit(msg("/stop", message_id="2"))
    await channel.wait_for(1)
    await settled(tmp_path)

    session = await sessions.get("test:c1")
    assert session is not None and [m.content for m in session.messages] == ["hello"]
    assert await pending(tmp_path) == []


class ModelDown:
    name, order, enabled = "model", 30, True

    def should_process(self, turn: object) -> bool:
        return True

    async def process(self, turn: object) -> None:
        raise LLMUnavailable("503")


async def test_a_stop_after_a_new_while_waiting_for_the_model_keeps_the_waiting_message(
    tmp_path: Path,
) -> None:
    """/stop says the waiting message is kept in the history: a /new had just cleared it from there."""
    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))

    async def new(call: CommandCall, control: SessionControl) -> str:
        async with control.exclusive(call.session_id):
            session = await sessions.get(call.session_id)
            if session is not None:
                await sessions.clear_messages(session)
            return "Session cleared."

    router = CommandRouter()
    router.add("new", "fresh", new)
    settings = DispatcherSettings(model_retry_first=30, model_retry_max=30, model_retry_max_age=60)
    dispatcher = Dispatcher(
        Pipeline([ModelDown()]), sessions, router, settings, inbox=Inbox(tmp_path / "inbox")
    )
    channel = RecordingChannel(dispatcher.submit)
    await dispatcher.recover()
    dispatcher.attach(channel)
    await dispatcher.submit(msg("hello"))
    await channel.wait_for(1)  # "I can't reach the AI model right now"
    await dispatcher.submit(msg("/new"))
    await dispatcher.submit(msg("/stop"))
    stop = (await channel.wait_for(3))[2].text
    session = await sessions.get("test:c1")
    await dispatcher.close(1)

    assert "kept in the history" in stop
    assert session is not None and [m.content for m in session.messages] == ["hello"]


class OutageChannel(RecordingChannel):
    down = True
    refused = 0

    async def send(self, message: OutboundMessage) -> None:
        if self.down and not message.aside:
            self.refused += 1
            raise ChannelError("could not deliver a reply: Bad Gateway")
        await super().send(message)


async def test_a_stop_while_an_answer_waits_out_an_outage_leaves_it_to_be_delivered(tmp_path: Path) -> None:
    """Saved and on its way (sent again with pauses), the answer is no reply to stop, as /status says."""
    dispatcher, channel, _ = await started(
        tmp_path, ModelSystem(), channel_type=OutageChannel, send_patience=30
    )
    await dispatcher.submit(msg("hello"))
    async with asyncio.timeout(10):
        # Answered and saved; its send failed, and is tried again later. /status: idle.
        while not channel.refused or dispatcher.is_running("test:c1"):
            await asyncio.sleep(0.01)
    await dispatcher.submit(msg("/stop"))
    assert "Nothing" in (await channel.wait_for(1))[0].text
    channel.down = False  # the outage ends

    assert [m.text for m in await channel.wait_for(2)][1] == "answer to hello"
    await settled(tmp_path)
    await dispatcher.close(1)


async def test_a_command_naming_another_bot_is_not_this_bots(tmp_path: Path) -> None:
    """In a group, /stop@OtherBot is meant for another bot: this bot's reply goes on (channels take
    their own bot's name off a command before the dispatcher sees it)."""
    model = ModelSystem()
    model.gate = asyncio.Event()
    dispatcher, channel, _ = await started(tmp_path, model)
    group = dict(chat="g1")
    await dispatcher.submit(msg("question for membot", **group))
    await model.started.wait()
    await dispatcher.submit(msg("/stop@OtherBot", **group))
    await asyncio.sleep(0.05)

    assert dispatcher.is_running("test:g1") and channel.sent == []
    await dispatcher.close(0)


async def test_messages_folded_past_the_queue_limit_stay_each_its_own(tmp_path: Path) -> None:
    """Answered in one turn, each is its own message in the history: a group member's words stay theirs
    (merged, Bob's "I live in Paris" read as Alice's), and a redelivery of any of them is recognized."""
    model = ModelSystem()
    model.gate = asyncio.Event()
    dispatcher, channel, sessions = await started(tmp_path, model, queue_limit=1)

    def said(who: str, text: str, message_id: str) -> InboundMessage:
        return InboundMessage("test", "g", who, text, sender_name=who, is_group=True, message_id=message_id)

    await dispatcher.submit(said("Carol", "first", "10"))
    await model.started.wait()
    await dispatcher.submit(said("Alice", "I live in Berlin", "11"))
    await dispatcher.submit(said("Bob", "I live in Paris", "12"))  # folded behind Alice's
    model.gate.set()
    await channel.wait_for(3)  # the notice, then an answer to each turn
    await settled(tmp_path)
    seen = list(model.seen)
    await dispatcher.submit(said("Bob", "I live in Paris", "12"))  # redelivered (a catch-up)
    await asyncio.sleep(0.05)
    session = await sessions.get("test:g")
    await dispatcher.close(1)

    assert session is not None
    users = [m.content for m in session.messages if m.role is Role.USER]
    assert users == ["Carol: first", "Alice: I live in Berlin", "Bob: I live in Paris"]
    assert model.seen == seen and len(seen) == 2  # two turns; the redelivery is not answered again


def clearing_new(sessions: SessionService, ran: list[str]) -> CommandRouter:
    """A router whose /new does what bot/commands/session.py's does to the session (without memory):
    it waits for the chat's lane, then clears the conversation. ``ran`` gets each run's message id."""

    async def new(call: CommandCall, control: SessionControl) -> str:
        async with control.exclusive(call.session_id):
            ran.append(call.message.message_id or "")
            async with sessions.lease(call.message.channel, call.message.chat_id) as session:
                await sessions.clear_messages(session)
            return "Session cleared."

    router = CommandRouter()
    router.add("new", "Start a fresh conversation", new)
    return router


async def turn_running(
    tmp_path: Path, sessions: SessionService, text: str
) -> tuple[Dispatcher, RecordingChannel, asyncio.Event, list[str]]:
    """A started dispatcher whose chat's turn on ``text`` (platform id "1") runs, held at the model's gate;
    /new clears the session, and the list gets the id of each /new that ran."""
    model = ModelSystem()
    model.gate = gate = asyncio.Event()
    ran: list[str] = []
    dispatcher = Dispatcher(
        Pipeline([model]),
        sessions,
        clearing_new(sessions, ran),
        DispatcherSettings(),
        inbox=Inbox(tmp_path / "inbox"),
    )
    channel = RecordingChannel(dispatcher.submit)
    await dispatcher.recover()
    dispatcher.attach(channel)
    await dispatcher.submit(msg(text, message_id="1"))
    await model.started.wait()
    return dispatcher, channel, gate, ran


async def new_behind_a_queued_message(
    tmp_path: Path, sessions: SessionService
) -> tuple[Dispatcher, RecordingChannel, asyncio.Event, list[str]]:
    """A chat whose turn runs (held at the model's gate) with a message and then a /new queued behind it;
    the list gets the id of each /new that ran."""
    dispatcher, channel, gate, ran = await turn_running(tmp_path, sessions, "what's up?")
    await dispatcher.submit(msg("remember that my locker code is 4512", message_id="2"))
    await dispatcher.submit(msg("/new", message_id="3"))
    return dispatcher, channel, gate, ran


async def test_a_message_sent_before_a_new_belongs_to_the_old_conversation(tmp_path: Path) -> None:
    """While a turn runs, a message is queued and then /new is sent: the message is answered in the
    conversation it was sent to, and /new clears it after that, as the next start does after a kill
    (see test_a_new_waiting_for_a_turn_runs_once_after_a_restart_in_its_place). /new overtook it, and
    the message was answered in the fresh conversation, which kept it."""
    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
    dispatcher, channel, gate, ran = await new_behind_a_queued_message(tmp_path, sessions)
    gate.set()
    await channel.wait_for(4)  # the "⏳" notice, two answers and /new's
    await settled(tmp_path)
    session = await sessions.get("test:c1")
    await dispatcher.close(1)

    assert [m.text for m in channel.sent[1:]] == [
        "answer to what's up?",
        "answer to remember that my locker code is 4512",
        "Session cleared.",
    ]
    assert ran == ["3"] and session is not None and session.messages == []
    assert channel.sent[0].text.startswith("⏳ /new runs once the current reply and the 1 message")


async def test_a_command_redelivered_after_it_ran_does_not_run_again(tmp_path: Path) -> None:
    """A platform hands over again a /new that ran, and the message sent after it (Discord's catch-up
    from a mark not yet on disk, Telegram after a kill before its journal's release): neither is taken
    again. The /new ran again, wiped what was said after it, and that message was answered twice."""

    def dispatcher_on(model: ModelSystem, ran: list[str]) -> tuple[Dispatcher, RecordingChannel]:
        sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
        router = clearing_new(sessions, ran)
        dispatcher = Dispatcher(
            Pipeline([model]), sessions, router, DispatcherSettings(), inbox=Inbox(tmp_path / "inbox")
        )
        return dispatcher, RecordingChannel(dispatcher.submit)

    ran: list[str] = []
    model = ModelSystem()
    before, channel = dispatcher_on(model, ran)
    await before.recover()
    before.attach(channel)
    await before.submit(msg("hello", message_id="1"))
    await channel.wait_for(1)
    await before.submit(msg("/new", message_id="2"))
    await before.submit(msg("/new", message_id="2"))  # redelivered at once (a RESUME's replay)
    await before.submit(msg("after the new", message_id="3"))
    await channel.wait_for(3)
    await settled(tmp_path)
    await before.close(1)
    model2 = ModelSystem()
    after, channel2 = dispatcher_on(model2, ran)
    await after.recover()
    after.attach(channel2)
    await after.submit(msg("/new", message_id="2"))  # the redeliveries after the restart
    await after.submit(msg("after the new", message_id="3"))
    await asyncio.sleep(0.1)
    session = await SessionService(JsonSessionStore(tmp_path / "sessions")).get("test:c1")
    await after.close(1)

    assert ran == ["2"] and channel2.sent == [] and model2.seen == []
    assert [m.text for m in channel.sent] == [
        "answer to hello",
        "Session cleared.",
        "answer to after the new",
    ]
    assert session is not None
    assert [m.content for m in session.messages] == ["after the new", "answer to after the new"]


async def test_a_shutdown_leaves_a_new_behind_a_queued_message_to_the_next_start_in_its_place(
    tmp_path: Path,
) -> None:
    """The queued message is left to the next start, so the /new sent after it is too: run while the
    shutdown waited for the turn, it came before that message, which was then answered after the
    restart in the fresh conversation."""
    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
    dispatcher, _, gate, ran = await new_behind_a_queued_message(tmp_path, sessions)
    closing = asyncio.create_task(dispatcher.close(5))
    await asyncio.sleep(0.01)
    gate.set()  # the running turn ends within the grace period
    await closing

    assert ran == []
    assert await pending(tmp_path) == ["remember that my locker code is 4512", "/new"]


async def test_a_new_whose_inbox_line_the_disk_refused_runs_when_handed_over_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The /new could not be kept (a full disk): ``submit`` fails, so the channel hands it over again
    once there is room. Its place in the queue stayed, and the worker noted it as run when it came:
    the redelivery was then ignored as a duplicate, and /new never ran."""
    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
    dispatcher, channel, gate, ran = await turn_running(tmp_path, sessions, "hello")
    real_write = os.write

    def full_inbox(fd: int, data: bytes) -> int:
        if "/inbox/" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_inbox)
    with pytest.raises(OSError, match="No space left"):
        await dispatcher.submit(msg("/new", message_id="2"))
    monkeypatch.setattr(os, "write", real_write)  # room again
    gate.set()
    await dispatcher.settled("test:c1")  # the lane's worker went past where the /new had its place
    await dispatcher.submit(msg("/new", message_id="2"))  # the channel's retry
    await channel.wait_for(2)
    session = await sessions.get("test:c1")
    await dispatcher.close(1)

    assert ran == ["2"] and channel.sent[-1].text == "Session cleared."
    assert session is not None and session.messages == []


async def test_a_stop_keeps_what_came_after_a_waiting_new_for_the_fresh_conversation(tmp_path: Path) -> None:
    """hello (running), /new (waits for it), a message, /stop: the message sent after /new belongs to
    the fresh conversation, kept there unanswered as /stop keeps queued messages. /stop put it in the
    old conversation first, and /new then cleared it."""
    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
    dispatcher, channel, _, ran = await turn_running(tmp_path, sessions, "hello")
    await dispatcher.submit(msg("/new", message_id="2"))
    await dispatcher.submit(msg("my locker code is 4512 now", message_id="3"))
    assert await dispatcher.stop("test:c1") == 1
    await channel.wait_for(2)  # the "⏳" notice and /new's answer
    await settled(tmp_path)
    session = await sessions.get("test:c1")
    await dispatcher.close(1)

    assert ran == ["2"] and [m.text for m in channel.sent][-1] == "Session cleared."
    assert session is not None
    assert [m.content for m in session.messages] == ["my locker code is 4512 now"]
    assert "answer to my locker code is 4512 now" not in [m.text for m in channel.sent]  # kept only


async def test_a_recovered_command_that_ran_before_the_kill_does_not_run_again(tmp_path: Path) -> None:
    """A /new that waited ran and its cleared session was saved (noting it as run), but a kill came
    before its inbox entry was marked done: the next start must not run it a second time."""
    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
    before, _, _, ran = await new_behind_a_queued_message(tmp_path, sessions)
    await before.close(0.05)  # the turn never ends: everything stays pending
    async with sessions.lease("test", "c1") as session:  # what the /new did before the kill
        await sessions.clear_messages(session)
        intake.note_command(session, "3")
        await sessions.save(session)
    assert "/new" in await pending(tmp_path)

    model = ModelSystem()
    after = Dispatcher(
        Pipeline([model]),
        sessions,
        clearing_new(sessions, ran),
        DispatcherSettings(),
        inbox=Inbox(tmp_path / "inbox"),
    )
    channel = RecordingChannel(after.submit)
    await after.recover()
    after.attach(channel)
    await channel.wait_for(1)  # the two messages, answered again (their answer never went out)
    await settled(tmp_path)
    await after.close(1)

    assert ran == [] and "Session cleared." not in [m.text for m in channel.sent]
    assert await pending(tmp_path) == []


async def test_each_part_of_a_joined_message_is_known_and_one_new_part_is_not_dropped(tmp_path: Path) -> None:
    """A channel joins a paste its client split (``joined`` names the later parts' ids): a redelivery of
    any part is that message again, but a joined message with a new part is answered, not dropped."""
    model = ModelSystem()
    dispatcher, channel, _ = await started(tmp_path, model)
    paste = dataclasses.replace(msg("part one\npart two", message_id="101"), joined=("102",))
    await dispatcher.submit(paste)
    await channel.wait_for(1)
    await settled(tmp_path)
    model2 = ModelSystem()
    dispatcher2, channel2, _ = await started(tmp_path, model2)
    await dispatcher2.submit(msg("part two", message_id="102"))  # its update handed over again, alone
    longer = dataclasses.replace(
        msg("part one\npart two\npart three", message_id="101"), joined=("102", "103")
    )
    await dispatcher2.submit(longer)  # joined again with a part never taken
    await channel2.wait_for(1)
    assert model.seen == ["part one\npart two"]
    assert model2.seen == ["part one\npart two\npart three"]


async def test_a_stop_on_a_full_disk_is_done_once_storage_returns_and_the_chat_is_told(
    tmp_path: Path,
) -> None:
    """A /stop whose bookkeeping the disk refused was answered "/stop failed" though the turn had
    stopped, and left the stopped and the kept message pending: the next start answered what the user
    had stopped, after what they sent later."""
    model = ModelSystem()
    dispatcher, channel, _ = await started(tmp_path, model)
    await dispatcher.submit(msg("first"))
    await channel.wait_for(1)
    model.gate, model.started = asyncio.Event(), asyncio.Event()
    await dispatcher.submit(msg("hang"))
    await model.started.wait()
    await dispatcher.submit(msg("queued"))
    repairs = [break_folder(tmp_path / "sessions"), break_folder(tmp_path / "inbox")]  # a full disk
    stop = asyncio.create_task(dispatcher.submit(msg("/stop")))
    notice = (await channel.wait_for(2))[1]
    assert "can't save" in notice.text and notice.aside
    for repair in repairs:
        repair()
    await stop
    reply = channel.sent[2]
    assert reply.text.startswith("⏹ Stopped. 1 queued message kept in the history")
    await settled(tmp_path)  # nothing pending: no start answers what the user stopped
    model.gate.set()
    await dispatcher.close(grace=1)
    stored = await JsonSessionStore(tmp_path / "sessions").load("test:c1")
    assert stored is not None
    assert [m.content for m in stored.messages] == ["first", "answer to first", "hang", "queued"]
    assert model.seen == ["first"] and len(channel.sent) == 3


async def test_an_inbox_file_a_start_could_not_read_is_never_cut_and_the_next_start_answers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chat's inbox file the start could not read (EIO) was skipped, and the chat's next answered
    message cut it to nothing: the question a kill had left pending there was gone for good."""
    inbox = Inbox(tmp_path / "inbox")
    await inbox.load_pending()
    _, written = inbox.add(msg("asked before the kill", message_id="1"))
    await written  # accepted, never answered: a kill
    (path,) = (tmp_path / "inbox").glob("*.jsonl")
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:  # the disk cannot read this file now (a bad sector)
        if self == path:
            raise OSError(errno.EIO, "Input/output error", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    model = ModelSystem()
    dispatcher, channel, _ = await started(tmp_path, model)
    monkeypatch.undo()  # the file reads again: only this start missed it
    await dispatcher.submit(msg("asked after the start", message_id="2"))
    await channel.wait_for(1)
    await dispatcher.close(grace=1)
    assert model.seen == ["asked after the start"]

    model = ModelSystem()
    _, channel, _ = await started(tmp_path, model)  # the next start reads it
    await channel.wait_for(1)
    await settled(tmp_path)
    assert model.seen == ["asked before the kill"]


async def test_a_first_message_while_sessions_cannot_be_read_is_answered_once_storage_returns(
    tmp_path: Path,
) -> None:
    """A message from a chat with no session yet, while the sessions folder was unusable, crashed its
    turn (its session could not be read): the chat was told it would be answered after a restart, and
    only a restart answered it."""
    model = ModelSystem()
    dispatcher, channel, _ = await started(tmp_path, model)
    repair = break_folder(tmp_path / "sessions")  # no session can be read or written
    await dispatcher.submit(msg("hello", message_id="1"))
    notice = (await channel.wait_for(1))[0]
    assert "can't read our conversation" in notice.text and notice.aside
    assert "restart" not in notice.text
    assert dispatcher.storage_wait("test:c1") == "session_load"
    await asyncio.sleep(0.2)  # tries again meanwhile, without telling again
    assert len(channel.sent) == 1
    repair()
    answer = (await channel.wait_for(2))[1]
    assert answer.text == "answer to hello" and not answer.aside
    await settled(tmp_path)
    await dispatcher.close(grace=1)
    assert model.seen == ["hello"] and len(channel.sent) == 2
    stored = await JsonSessionStore(tmp_path / "sessions").load("test:c1")
    assert stored is not None and [m.content for m in stored.messages] == ["hello", "answer to hello"]
