"""Dispatcher: ordering, no overlap, collect mode, commands first, overflow, /stop, crash recovery."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from bot.commands import CommandRouter
from bot.config import DispatcherSettings
from bot.dispatcher import Dispatcher
from bot.domain import InboundMessage, Message, OutboundMessage, Role, utcnow
from bot.inbox import Inbox
from bot.session_service import SessionService
from bot.sessions import JsonSessionStore
from pipeline import Pipeline, System, Turn
from tests.recording import RecordingChannel


class ModelSystem:
    """Stands in for the LLM step: records what each turn saw, optionally slowly."""

    name, order, enabled = "model", 30, True

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.seen: list[str] = []
        self.active: dict[str, int] = {}
        self.max_overlap = 0
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()  # set when a turn reaches the model

    def should_process(self, turn: Turn) -> bool:
        return True

    async def process(self, turn: Turn) -> None:
        sid = turn.session.id
        self.active[sid] = self.active.get(sid, 0) + 1
        self.max_overlap = max(self.max_overlap, self.active[sid])
        self.started.set()
        try:
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(self.delay)
            self.seen.append(turn.user_text)
            turn.add_message(Message(Role.ASSISTANT, f"answer to {turn.user_text}"))
            turn.reply = f"answer to {turn.user_text}"
        finally:
            self.active[sid] -= 1


def build(
    tmp_path: Path, model: System, *, clock: Callable[[], datetime] = utcnow, **settings: object
) -> tuple[Dispatcher, RecordingChannel, SessionService]:
    """A dispatcher over ``model`` with an inbox and sessions on disk; ``clock``: the machine's."""
    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
    dispatcher = Dispatcher(
        Pipeline([model]),
        sessions,
        CommandRouter(),
        DispatcherSettings(**settings),  # type: ignore[arg-type]
        inbox=Inbox(tmp_path / "inbox"),
        clock=clock,
    )
    channel = RecordingChannel(dispatcher.submit)
    dispatcher.attach(channel)
    return dispatcher, channel, sessions


def msg(text: str, chat: str = "c1") -> InboundMessage:
    return InboundMessage(channel="test", chat_id=chat, sender_id="u1", text=text)


async def test_fifty_messages_one_session_in_order_without_overlap(tmp_path: Path) -> None:
    model = ModelSystem(delay=0.002)
    dispatcher, channel, sessions = build(tmp_path, model, mode="per_message", queue_limit=100)
    await asyncio.gather(*(dispatcher.submit(msg(f"m{i}")) for i in range(50)))
    await channel.wait_for(50)
    assert model.seen == [f"m{i}" for i in range(50)]
    assert model.max_overlap == 1
    session = await sessions.get("test:c1")
    assert session is not None
    assert [m.content for m in session.messages if m.role is Role.USER] == [f"m{i}" for i in range(50)]


async def test_collect_mode_takes_queued_messages_together(tmp_path: Path) -> None:
    model = ModelSystem()
    model.gate = asyncio.Event()
    dispatcher, channel, _ = build(tmp_path, model)
    await dispatcher.submit(msg("first"))
    await asyncio.sleep(0.01)
    for text in ("second", "third"):
        await dispatcher.submit(msg(text))
    model.gate.set()
    await channel.wait_for(2)
    assert model.seen == ["first", "second\n\nthird"]


async def test_two_sessions_progress_in_parallel(tmp_path: Path) -> None:
    model = ModelSystem()
    model.gate = asyncio.Event()
    dispatcher, channel, _ = build(tmp_path, model)
    await dispatcher.submit(msg("a", chat="one"))
    await dispatcher.submit(msg("b", chat="two"))
    await asyncio.sleep(0.05)
    assert dispatcher.is_running("test:one") and dispatcher.is_running("test:two")
    model.gate.set()
    await channel.wait_for(2)


async def test_command_is_answered_while_a_slow_turn_runs(tmp_path: Path) -> None:
    model = ModelSystem()
    model.gate = asyncio.Event()
    dispatcher, channel, _ = build(tmp_path, model)
    await dispatcher.submit(msg("slow question"))
    await asyncio.sleep(0.01)
    await dispatcher.submit(msg("/help"))
    sent = await channel.wait_for(1)
    assert "Commands:" in sent[0].text
    assert sent[0].aside  # beside the running turn: it must not take over a message that turn streams into
    assert dispatcher.is_running("test:c1")
    model.gate.set()
    answer = (await channel.wait_for(2))[1]
    assert not answer.aside and answer.key is not None  # the turn's answer, sent again by its key


async def test_stop_cancels_turn_and_keeps_queued_messages(tmp_path: Path) -> None:
    model = ModelSystem()
    model.gate = asyncio.Event()  # never set: the turn hangs until stopped
    dispatcher, channel, sessions = build(tmp_path, model)
    await dispatcher.submit(msg("hang"))
    await asyncio.sleep(0.01)
    await dispatcher.submit(msg("queued one"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    await dispatcher.submit(msg("/stop"))
    assert loop.time() - started < 1.0
    sent = await channel.wait_for(1)
    assert "Stopped" in sent[0].text and "1 queued message" in sent[0].text
    assert not dispatcher.is_running("test:c1")
    session = await sessions.get("test:c1")
    assert session is not None
    assert [m.content for m in session.messages] == ["hang", "queued one"]
    model.gate.set()
    await dispatcher.submit(msg("next"))
    await channel.wait_for(2)
    assert model.seen == ["next"]


async def test_stop_with_nothing_running(tmp_path: Path) -> None:
    dispatcher, channel, _ = build(tmp_path, ModelSystem())
    await dispatcher.submit(msg("/stop"))
    assert (await channel.wait_for(1))[0].text == "Nothing is running."


async def test_overflow_is_folded_not_dropped(tmp_path: Path) -> None:
    model = ModelSystem()
    model.gate = asyncio.Event()
    dispatcher, channel, _ = build(tmp_path, model, queue_limit=3)
    await dispatcher.submit(msg("running"))
    await asyncio.sleep(0.01)
    for i in range(6):
        await dispatcher.submit(msg(f"q{i}"))
    assert dispatcher.queue_depth("test:c1") == 6  # messages waiting, the folded ones counted
    notices = [m for m in channel.sent if "nothing is lost" in m.text]
    assert len(notices) == 1
    model.gate.set()
    await channel.wait_for(3)
    assert model.seen[1] == "q0\n\nq1\n\nq2\n\nq3\n\nq4\n\nq5"


async def answer_once(dispatcher: Dispatcher) -> list[OutboundMessage]:
    """What the chat is sent for one "hello"."""
    channel = RecordingChannel(dispatcher.submit)
    dispatcher.attach(channel)
    await dispatcher.submit(msg("hello"))
    return await channel.wait_for(1)


async def test_no_reply_becomes_an_honest_error(tmp_path: Path) -> None:
    class Broken:
        name, order, enabled = "broken", 30, True

        def should_process(self, turn: Turn) -> bool:
            return True

        async def process(self, turn: Turn) -> None:
            raise RuntimeError("provider exploded")

    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
    sent = await answer_once(
        Dispatcher(Pipeline([Broken()]), sessions, CommandRouter(), DispatcherSettings())
    )
    assert sent[0].is_error and "something went wrong on my side" in sent[0].text
    assert "provider exploded" not in sent[0].text and "RuntimeError" not in sent[0].text  # log only
    session = await sessions.get("test:c1")
    assert session is not None and session.messages[0].content == "hello"  # the question is kept


async def test_a_blank_reply_is_never_sent_blank(tmp_path: Path) -> None:
    class Blank:
        name, order, enabled = "blank", 30, True

        def should_process(self, turn: Turn) -> bool:
            return True

        async def process(self, turn: Turn) -> None:
            turn.reply = " \n\t "  # Discord drops such a message unseen, Telegram shows "(empty reply)"

    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
    sent = await answer_once(Dispatcher(Pipeline([Blank()]), sessions, CommandRouter(), DispatcherSettings()))
    assert sent[0].is_error and "empty answer" in sent[0].text


async def test_accepted_messages_survive_a_crash(tmp_path: Path) -> None:
    model = ModelSystem()
    model.gate = asyncio.Event()  # the first "process" never finishes its turn
    dispatcher, _, _ = build(tmp_path, model)
    await dispatcher.submit(msg("asked before the crash"))
    async with asyncio.timeout(10):  # its turn is at the model (held by the gate) before the next arrives
        await model.started.wait()
    await dispatcher.submit(msg("accepted, then the process died"))
    # "Crash": a new process with fresh objects over the same workspace.
    model2 = ModelSystem()
    dispatcher2, channel2, sessions2 = build(tmp_path, model2)
    assert await dispatcher2.recover() == 2  # the one in flight too: it was never answered
    await channel2.wait_for(1)
    assert model2.seen == ["asked before the crash\n\naccepted, then the process died"]
    session = await sessions2.get("test:c1")
    assert session is not None
    assert [m.content for m in session.messages if m.role is Role.USER] == [
        "asked before the crash",
        "accepted, then the process died",
    ]
    async with asyncio.timeout(10):
        while await Inbox(tmp_path / "inbox").load_pending():  # the done mark follows the send
            await asyncio.sleep(0.01)
    await dispatcher.close(0)  # end the first "process" (its late save goes nowhere we look)


async def test_a_torn_inbox_line_does_not_swallow_the_next_message(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "inbox")
    _, written = inbox.add(msg("before the crash"))
    await written
    (path,) = (tmp_path / "inbox").glob("*.jsonl")
    with path.open("ab") as f:
        f.write(b'{"entry": "\xff\x80 not UTF-8"}\n')  # a damaged line
        f.write(b'{"entry": "half-writt')  # the process died mid-append
    restarted = Inbox(tmp_path / "inbox")
    assert [e.message.text for e in await restarted.load_pending()] == ["before the crash"]
    _, written = restarted.add(msg("after the restart"))
    await written
    recovered = await Inbox(tmp_path / "inbox").load_pending()
    assert [e.message.text for e in recovered] == ["before the crash", "after the restart"]


async def test_oversized_inbound_is_truncated_with_a_note(tmp_path: Path) -> None:
    model = ModelSystem()
    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
    dispatcher = Dispatcher(
        Pipeline([model]), sessions, CommandRouter(), DispatcherSettings(), max_inbound_chars=100
    )
    channel = RecordingChannel(dispatcher.submit)
    dispatcher.attach(channel)
    await dispatcher.submit(msg("x" * 5000))
    await channel.wait_for(1)
    assert model.seen[0].startswith("x" * 100) and "truncated" in model.seen[0]


async def test_a_turn_past_its_deadline_is_stopped_and_explained(tmp_path: Path) -> None:
    model = ModelSystem()
    model.gate = asyncio.Event()  # hangs
    dispatcher, channel, sessions = build(tmp_path, model, turn_timeout=0.2)
    await dispatcher.submit(msg("endless"))
    sent = await channel.wait_for(1)
    assert sent[0].is_error and "longer than 0.2 s" in sent[0].text
    session = await sessions.get("test:c1")
    assert session is not None and session.messages[0].content == "endless"


class Remembering:
    """A system that leaves a durable write on the turn, as MemoryPersist does, finished by the test."""

    name, order, enabled = "remember", 50, True

    def __init__(self) -> None:
        self.write: asyncio.Future[None] | None = None
        self.anticipated: list[str] = []

    def should_process(self, turn: Turn) -> bool:
        return True

    def anticipate(self, message: InboundMessage) -> None:
        self.anticipated.append(message.text)

    async def process(self, turn: Turn) -> None:
        self.write = asyncio.get_running_loop().create_future()
        turn.writes.append(self.write)


async def test_the_reply_waits_for_the_turns_own_writes_and_a_failed_one_costs_no_answer(
    tmp_path: Path,
) -> None:
    remembering = Remembering()
    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
    dispatcher = Dispatcher(
        Pipeline([ModelSystem(), remembering]), sessions, CommandRouter(), DispatcherSettings(),
        inbox=Inbox(tmp_path / "inbox"),
    )  # fmt: skip
    channel = RecordingChannel(dispatcher.submit)
    dispatcher.attach(channel)
    await dispatcher.submit(msg("remember this"))
    for _ in range(50):
        await asyncio.sleep(0.01)
        if remembering.write is not None:
            break
    assert remembering.write is not None
    await asyncio.sleep(0.05)
    assert channel.sent == []  # the session is saved, the turn's write is not on disk yet: no reply
    remembering.write.set_result(None)
    assert (await channel.wait_for(1))[0].text == "answer to remember this"

    remembering.write = None
    await dispatcher.submit(msg("and this"))
    while remembering.write is None:
        await asyncio.sleep(0.01)
    remembering.write.set_exception(OSError(28, "No space left on device"))
    sent = await channel.wait_for(2)
    assert sent[1].text == "answer to and this" and not sent[1].is_error  # logged, not the user's problem
    assert remembering.anticipated == ["remember this", "and this"]  # alone in the lane: a head start


async def test_a_message_that_will_join_others_is_not_anticipated(tmp_path: Path) -> None:
    model, remembering = ModelSystem(), Remembering()
    model.gate = asyncio.Event()
    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
    dispatcher = Dispatcher(
        Pipeline([model, remembering]), sessions, CommandRouter(), DispatcherSettings(),
        inbox=Inbox(tmp_path / "inbox"),
    )  # fmt: skip
    channel = RecordingChannel(dispatcher.submit)
    dispatcher.attach(channel)
    await dispatcher.submit(msg("first"))
    await model.started.wait()
    for text in ("second", "third"):  # queued behind "first": the next turn takes them together
        await dispatcher.submit(msg(text))
    model.gate.set()
    while len(channel.sent) < 2:
        if remembering.write is not None and not remembering.write.done():
            remembering.write.set_result(None)
        await asyncio.sleep(0.01)
    assert model.seen == ["first", "second\n\nthird"]
    assert remembering.anticipated == ["first"]  # the others came during a turn: they may join (collect)
