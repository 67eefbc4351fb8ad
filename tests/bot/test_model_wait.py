"""A model out of reach: the chat is told once, and the lane answers by itself when the model is back.

End to end: the dispatcher, pipeline and real LLM client (no client retries) of ``Bot`` against the fake
model server, made to answer 503 or 429 while it is "down". A "restart" is a second ``Bot`` over the same
workspace, as a new process would build it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.catalog import ModelCatalog
from bot.domain import InboundMessage, Role
from bot.inbox import Inbox
from bot.model_wait import NOTICE, WAIT_FILE
from bot.session_moves import carry_moves, record_move
from bot.sessions import JsonSessionStore
from bot.tokens import TokenCounter
from tests.bot.commands.test_session import MODEL, SID, Bot, wait_until
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.llm_wire import AZURE_FILTERED
from tests.recording import StreamingChannel

QUICK = {"model_retry_first": 0.05, "model_retry_max": 0.1, "model_retry_max_age": 60.0}
PATIENT = {"model_retry_first": 30.0, "model_retry_max": 30.0, "model_retry_max_age": 60.0}  # no try by time
TODAY = "Your message is saved — send another message to try again."


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter.offline(model=MODEL, provider="openai")


@pytest.fixture
def bot_on(
    tmp_path: Path,
    server: FakeLLMServer,
    catalog: ModelCatalog,
    http: httpx.AsyncClient,
    counter: TokenCounter,
) -> Callable[..., Bot]:
    """A membot wired as bot/app.py wires it, on this test's workspace: ``async with bot_on() as bot``."""
    return lambda **options: Bot(tmp_path, server, catalog, http, counter, **options)


class Model:
    """Switches the fake server between down (every chat request gets ``status``) and up (it echoes)."""

    def __init__(self, server: FakeLLMServer, status: int = 503) -> None:
        self.down = True
        self.status = status
        server.responder = lambda api, body: FakeReply(status=self.status) if self.down else None


def msg(text: str, chat: str = "c1") -> InboundMessage:
    return InboundMessage("test", chat, "u1", text)


async def pending(root: Path) -> list[str]:
    return [e.message.text for e in await Inbox(root / "inbox").load_pending()]


async def inbox_done(root: Path) -> None:
    """Until nothing is pending in the inbox on disk (the done mark follows the send)."""
    async with asyncio.timeout(5):
        while await pending(root):
            await asyncio.sleep(0.01)


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


def texts(bot: Bot) -> list[str]:
    return [m.text for m in bot.channel.sent]


@pytest.mark.parametrize("status", [503, 429])
async def test_a_model_out_of_reach_is_told_once_and_the_answer_comes_by_itself(
    bot_on: Callable[..., Bot],
    server: FakeLLMServer,
    tmp_path: Path,
    status: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = Model(server, status)
    async with bot_on(dispatcher=QUICK) as bot:
        assert await bot.say("hello?") == NOTICE
        assert bot.channel.sent[0].aside  # beside the turn: not its answer
        await wait_until(lambda: len(server.requests) >= 4)  # tried again and again, told once
        assert texts(bot) == [NOTICE]
        assert await pending(tmp_path) == ["hello?"]  # unanswered: a restart would answer it
        assert await bot.on_disk() == [(Role.USER, "hello?")]
        model.down = False
        await bot.channel.wait_for(2)
        await asyncio.sleep(0.3)  # more tries would have been due by now
        assert texts(bot) == [NOTICE, "echo: hello?"]
        assert not bot.channel.sent[1].aside
        assert await bot.on_disk() == [(Role.USER, "hello?"), (Role.ASSISTANT, "echo: hello?")]
        await inbox_done(tmp_path)
    waits = logged(caplog, "turn_waiting_for_model")
    assert [w["attempt"] for w in waits] == list(range(1, len(waits) + 1)) and len(waits) >= 3
    assert all(w["chat_id"] == "c1" and isinstance(w["next_try_in"], float) for w in waits)
    [retried] = logged(caplog, "turn_retried")
    assert retried["attempts"] == len(waits) + 1 and retried["answered"] is True


async def test_a_message_sent_while_waiting_joins_and_is_tried_at_once(
    bot_on: Callable[..., Bot], server: FakeLLMServer, tmp_path: Path
) -> None:
    model = Model(server)
    async with bot_on(dispatcher=PATIENT) as bot:
        assert await bot.say("first") == NOTICE
        status = await bot.say("/status")
        assert re.search(r"^Queue: 1 waiting · waiting for the AI model \(next try in \d+s\)$", status, re.M)
        tries = len(server.requests)
        model.down = False
        answer = "echo: first\n\nsecond"  # the fake echoes the user's messages since the last answer
        assert await bot.say("second") == answer  # at once, not after the 30 s pause
        await asyncio.sleep(0.1)
        assert texts(bot)[2:] == [answer]  # one answer
        assert len(server.requests) == tries + 1
        asked = [m["content"] for m in server.requests[-1].body["messages"] if m["role"] == "user"]
        assert asked[-1] == "first\n\nsecond"  # it covers both (the request joins a run of user messages)
        assert await bot.on_disk() == [
            (Role.USER, "first"),
            (Role.USER, "second"),
            (Role.ASSISTANT, answer),
        ]
        await inbox_done(tmp_path)
        assert "Queue: 0 waiting · idle" in await bot.say("/status")


async def test_stop_while_waiting_ends_the_wait_and_keeps_the_messages(
    bot_on: Callable[..., Bot], server: FakeLLMServer, tmp_path: Path
) -> None:
    model = Model(server)
    async with bot_on(dispatcher=PATIENT) as bot:
        assert await bot.say("hello?") == NOTICE
        await bot.dispatcher.submit(msg("anyone?"))  # tried at once, fails again: no second notice
        await wait_until(lambda: len(server.requests) == 2 and bot.dispatcher.model_wait(SID) is not None)
        stopped = (
            "⏹ Stopped waiting for the AI model: your 2 waiting messages are kept in the history, "
            "unanswered; your next message starts a new turn."
        )
        assert await bot.say("/stop") == stopped
        async with asyncio.timeout(1):
            await bot.dispatcher.settled(SID)  # the lane's worker ended: nothing will answer them
        assert bot.dispatcher.model_wait(SID) is None
        assert await pending(tmp_path) == []
        assert await bot.say("/stop") == "Nothing is running."
        model.down = False
        await asyncio.sleep(0.2)
        assert texts(bot) == [NOTICE, stopped, "Nothing is running."]  # no answer of their own
        answer = "echo: hello?\n\nanyone?\n\nand now?"  # the next turn sees them in the history
        assert await bot.say("and now?") == answer
        assert await bot.on_disk() == [
            (Role.USER, "hello?"),
            (Role.USER, "anyone?"),
            (Role.USER, "and now?"),
            (Role.ASSISTANT, answer),
        ]


async def test_past_the_max_age_the_chat_is_asked_to_send_it_again(
    bot_on: Callable[..., Bot], server: FakeLLMServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    Model(server)
    async with bot_on(dispatcher={**QUICK, "model_retry_max_age": 0.4}) as bot:
        assert await bot.say("hello?") == NOTICE
        [_, failed] = await bot.channel.wait_for(2)
        assert failed.text == (
            f"⚠️ Sorry, I couldn't answer this time (the AI model cannot be reached right now). {TODAY}"
        )
        assert failed.is_error and not failed.aside
        await inbox_done(tmp_path)  # done, as before
        tries = len(server.requests)
        assert tries >= 3
        await asyncio.sleep(0.3)
        assert len(server.requests) == tries and len(texts(bot)) == 2
        assert bot.dispatcher.model_wait(SID) is None
        users = [text for role, text in await bot.on_disk() if role is Role.USER]
        assert users == ["hello?"]
    assert len(logged(caplog, "model_wait_gave_up")) == 1


async def test_a_restart_while_waiting_answers_once_after_the_start(
    server: FakeLLMServer, tmp_path: Path, bot_on: Callable[..., Bot]
) -> None:
    model = Model(server)
    async with bot_on(dispatcher=PATIENT) as before:
        assert await before.say("hello?") == NOTICE
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 2  # the shutdown does not wait for the next try
    assert texts(before) == [NOTICE]
    assert await pending(tmp_path) == ["hello?"]
    model.down = False
    async with bot_on(dispatcher=PATIENT) as after:
        assert await after.dispatcher.recover() == 1
        await after.channel.wait_for(1)
        await asyncio.sleep(0.1)
        assert texts(after) == ["echo: hello?"]
        assert await after.on_disk() == [(Role.USER, "hello?"), (Role.ASSISTANT, "echo: hello?")]
        await inbox_done(tmp_path)


async def test_a_restart_while_the_model_is_still_down_does_not_tell_the_chat_again(
    server: FakeLLMServer, tmp_path: Path, bot_on: Callable[..., Bot]
) -> None:
    """The chat was told once that its answer waits for the model; a restart during the outage tries the
    same messages again, and they still wait: the chat is not told a second time. A later outage is."""
    model = Model(server)
    async with bot_on(dispatcher=PATIENT) as before:
        assert await before.say("hello?") == NOTICE
    async with bot_on(dispatcher=QUICK) as after:
        assert await after.dispatcher.recover() == 1
        await wait_until(lambda: len(server.requests) >= 4)  # tried again after the start, still down
        assert texts(after) == []
        assert await pending(tmp_path) == ["hello?"]
        model.down = False
        await after.channel.wait_for(1)
        await asyncio.sleep(0.2)
        assert texts(after) == ["echo: hello?"]
        await inbox_done(tmp_path)
    model.down = True
    async with bot_on(dispatcher=PATIENT) as later:
        assert await later.dispatcher.recover() == 0
        assert await later.say("and now?") == NOTICE  # a new wait: told again


async def test_a_restart_does_not_restart_the_waits_clock(
    server: FakeLLMServer, tmp_path: Path, bot_on: Callable[..., Bot]
) -> None:
    """``model_retry_max_age`` counts from the first failure, across a restart: a chat that has waited
    that long is told to send it again at the first failed try after the start, not after another wait."""
    Model(server)
    slow = {"model_retry_first": 30.0, "model_retry_max": 30.0, "model_retry_max_age": 1.0}
    async with bot_on(dispatcher=slow) as before:
        assert await before.say("hello?") == NOTICE
    await asyncio.sleep(1.1)
    async with bot_on(dispatcher=slow) as after:
        tries = len(server.requests)
        assert await after.dispatcher.recover() == 1
        [failed] = await after.channel.wait_for(1, timeout=0.8)
        assert failed.text == (
            f"⚠️ Sorry, I couldn't answer this time (the AI model cannot be reached right now). {TODAY}"
        )
        assert len(server.requests) == tries + 1
        await inbox_done(tmp_path)


async def test_a_new_kept_over_a_restart_does_not_wait_for_the_model(
    server: FakeLLMServer, tmp_path: Path, bot_on: Callable[..., Bot]
) -> None:
    """A /new that waited for a try when the bot stopped runs after the start while the chat waits for
    the model, as it would have without the restart; the waiting question is answered in the fresh
    conversation once the model is back."""
    model = Model(server)
    server.responder = lambda api, body: FakeReply(status=503, delay=0.5) if model.down else None
    async with bot_on(dispatcher=PATIENT) as before:
        await before.dispatcher.submit(msg("hello?"))
        await wait_until(lambda: server.in_flight > 0)
        await before.dispatcher.submit(msg("/new"))
        [waiting] = await before.channel.wait_for(1)
        assert waiting.text.startswith("⏳ /new runs as soon as the current reply is done")
        before.grace = 0
    async with bot_on(dispatcher=PATIENT) as after:
        assert await after.dispatcher.recover() == 2
        sent = await after.channel.wait_for(2, timeout=5)  # well before the next try, 30 s away
        assert [m.text for m in sent] == [NOTICE, "Session cleared."]
        model.down = False
        assert await after.say("still there?") == "echo: hello?\n\nstill there?"
        assert await after.on_disk() == [
            (Role.USER, "hello?"),
            (Role.USER, "still there?"),
            (Role.ASSISTANT, "echo: hello?\n\nstill there?"),
        ]
        await inbox_done(tmp_path)


async def test_an_answer_the_model_declined_is_told_as_it_is_and_not_retried(
    bot_on: Callable[..., Bot], server: FakeLLMServer, tmp_path: Path
) -> None:
    server.responder = lambda api, body: FakeReply(stop="content_filter")
    async with bot_on(dispatcher=QUICK) as bot:
        assert await bot.say("hello?") == "⚠️ The AI model declined to answer this."
        await inbox_done(tmp_path)
        assert len(server.requests) == 1 and bot.dispatcher.model_wait(SID) is None


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (
            FakeReply(status=401),
            "the AI model refused the bot's access; the operator needs to check its settings",
        ),
        (FakeReply(malformed=True), "the AI model sent an answer that could not be used"),
        (
            FakeReply(status=400, error=AZURE_FILTERED),  # Azure OpenAI's filter flagged the prompt
            "the AI provider's content filter declined this request",
        ),
    ],
)
async def test_a_failure_that_would_repeat_is_told_at_once_and_not_retried(
    bot_on: Callable[..., Bot], server: FakeLLMServer, tmp_path: Path, reply: FakeReply, reason: str
) -> None:
    server.responder = lambda api, body: reply
    async with bot_on(dispatcher=QUICK) as bot:
        assert await bot.say("hello?") == f"⚠️ Sorry, I couldn't answer this time ({reason}). {TODAY}"
        await inbox_done(tmp_path)
        await asyncio.sleep(0.3)
        assert len(server.requests) == 1 and len(texts(bot)) == 1
        assert bot.dispatcher.model_wait(SID) is None


async def test_an_outage_is_waited_out_even_when_the_fallback_model_is_refused(
    bot_on: Callable[..., Bot], server: FakeLLMServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The primary is down (503) and the fallback cannot be used (no key for its provider): the outage
    is what the chat waits for. Raised as the chain's last error, the fallback's refused key told the
    chat "the operator needs to check its settings" at once and marked the message done, so the answer
    never came although the primary was back a moment later."""
    model = Model(server)
    async with bot_on(dispatcher=QUICK, llm={"fallback_models": ["claude-haiku-4-5"]}) as bot:
        assert await bot.say("hello?") == NOTICE
        model.down = False
        await bot.channel.wait_for(2)
        assert texts(bot) == [NOTICE, "echo: hello?"]
        await inbox_done(tmp_path)
    assert all(r.api == "openai" for r in server.requests)  # the fallback was never reachable
    refused = logged(caplog, "llm_fallback_failed")
    assert refused and "MEMBOT_LLM__ANTHROPIC__API_KEY" in str(refused[0]["error"])


async def test_an_answer_whose_stream_was_cut_off_mid_event_is_waited_for(
    bot_on: Callable[..., Bot], server: FakeLLMServer, tmp_path: Path
) -> None:
    """A streamed answer the connection or a proxy cut off inside an event (half a JSON chunk, then a
    proper end of the body) after its first words were shown: it did not come whole, so the turn
    waits for the model and answers then. Taken for malformed JSON, it was an answer "that could not
    be used": the chat was told at once to send the question again."""
    server.script(FakeReply(text="The answer is forty-two, as it always was.", cut_after=2))
    async with bot_on(dispatcher=QUICK, streaming=True) as bot:
        assert await bot.say("hello?") == NOTICE
        await bot.channel.wait_for(2)
        assert texts(bot) == [NOTICE, "echo: hello?"]
        await inbox_done(tmp_path)
        assert isinstance(bot.channel, StreamingChannel)
        previews = bot.channel.previews
        assert previews[0] == "The answer is " and previews[-1] == "echo: hello?"  # shown, then cut
        assert await bot.on_disk() == [(Role.USER, "hello?"), (Role.ASSISTANT, "echo: hello?")]


async def test_a_revoked_key_reported_mid_stream_is_told_at_once_not_waited_for(
    bot_on: Callable[..., Bot], server: FakeLLMServer, tmp_path: Path
) -> None:
    """OpenRouter and LiteLLM report a failure after HTTP 200 as a chunk with an ``error`` whose
    ``code`` is the status: 401 here. Read as any 500, the chat was told to wait for the model and the
    lane asked again and again, for an hour, with a key that will not work before the operator acts."""
    error = {"code": 401, "message": "User not found."}
    server.responder = lambda api, body: FakeReply(text="x", stream_error_after=0, openai_error=error)
    async with bot_on(dispatcher=QUICK, streaming=True) as bot:
        reason = "the AI model refused the bot's access; the operator needs to check its settings"
        assert await bot.say("hello?") == f"⚠️ Sorry, I couldn't answer this time ({reason}). {TODAY}"
        await inbox_done(tmp_path)
        await asyncio.sleep(0.3)  # QUICK's pauses would have tried again by now
        assert len(server.requests) == 1 and len(texts(bot)) == 1
        assert bot.dispatcher.model_wait(SID) is None


async def test_other_chats_are_answered_while_one_waits(
    bot_on: Callable[..., Bot], server: FakeLLMServer, tmp_path: Path
) -> None:
    def answer(api: str, body: dict[str, Any]) -> FakeReply | None:
        return FakeReply(status=503) if body["messages"][-1]["content"] == "hello?" else None

    server.responder = answer
    async with bot_on(dispatcher=QUICK) as bot:
        assert await bot.say("hello?") == NOTICE
        await bot.dispatcher.submit(msg("elsewhere", chat="c2"))
        await bot.channel.wait_for(2)
        assert bot.channel.sent[1].chat_id == "c2" and bot.channel.sent[1].text == "echo: elsewhere"
        assert bot.dispatcher.model_wait(SID) is not None or bot.dispatcher.is_running(SID)


async def test_the_next_try_waits_for_the_providers_retry_after(
    bot_on: Callable[..., Bot], server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A rate limit that says when to come back: trying sooner would only be refused again (and count
    against the limit), so the pause is at least Retry-After, though the backoff alone is 0.05 s."""
    down = True
    server.responder = lambda api, body: FakeReply(status=429, headers={"retry-after": "1"}) if down else None
    async with bot_on(dispatcher=QUICK) as bot:
        assert await bot.say("hello?") == NOTICE
        await asyncio.sleep(0.6)  # QUICK's own pauses (0.05 s, 0.1 s) would have tried again 5 times
        assert len(server.requests) == 1
        down = False
        [_, answered] = await bot.channel.wait_for(2)
        assert answered.text == "echo: hello?"
        assert len(server.requests) == 2
    [wait] = logged(caplog, "turn_waiting_for_model")
    assert wait["next_try_in"] == 1.0


async def test_a_retry_after_past_the_clients_cap_is_not_tried_early(
    bot_on: Callable[..., Bot], server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A rate limit that says "not for 30 s", past ``llm.retry_max_delay``: the client does not try
    again after its capped wait (each such try was refused again, counted against the limit, while the
    chat waited in silence); the chat is told at once and the turn waits as long as the server said."""
    down = True
    server.responder = lambda api, body: (
        FakeReply(status=429, headers={"retry-after": "30"}) if down else None
    )
    llm = {"max_retries": 3, "retry_max_delay": 0.05}
    async with bot_on(dispatcher=QUICK, llm=llm) as bot:
        assert await bot.say("hello?") == NOTICE
        assert len(server.requests) == 1
    [wait] = logged(caplog, "turn_waiting_for_model")
    assert wait["next_try_in"] == 30.0


async def test_the_primarys_retry_after_holds_when_a_fallback_fails_too(
    bot_on: Callable[..., Bot], server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The primary says "not for 30 s", the fallback is down (503, no hint): the turn waits the
    primary's 30 s, since the next try asks it first (the fallback's error came without a hint, and
    the wait's own backoff asked the primary again early, over and over)."""
    server.responder = lambda api, body: (
        FakeReply(status=429, headers={"retry-after": "30"})
        if body["model"] == "gpt-4.1-mini"
        else FakeReply(status=503)
    )
    llm = {"max_retries": 0, "retry_max_delay": 0.05, "fallback_models": ["gpt-4o-mini"]}
    async with bot_on(dispatcher=QUICK, llm=llm) as bot:
        assert await bot.say("hello?") == NOTICE
        assert [r.body["model"] for r in server.requests] == ["gpt-4.1-mini", "gpt-4o-mini"]
    [wait] = logged(caplog, "turn_waiting_for_model")
    assert wait["next_try_in"] == 30.0


async def test_a_damaged_wait_file_costs_only_a_second_notice(
    server: FakeLLMServer, tmp_path: Path, bot_on: Callable[..., Bot]
) -> None:
    """The file is kept aside for the operator; the start and the wait go on without it."""
    Model(server)
    async with bot_on(dispatcher=PATIENT) as before:
        assert await before.say("hello?") == NOTICE
    state = tmp_path / "state"
    await asyncio.to_thread((state / WAIT_FILE).write_text, '{"test:c1": {"since": ')  # a torn write
    async with bot_on(dispatcher=PATIENT) as after:
        assert await after.dispatcher.recover() == 1
        [told] = await after.channel.wait_for(1)
        assert told.text == NOTICE
        assert [p.name for p in state.iterdir() if p.name.startswith(f"{WAIT_FILE}.damaged-")]


async def test_a_chat_whose_id_changed_while_it_waited_is_not_told_again(
    server: FakeLLMServer, tmp_path: Path, bot_on: Callable[..., Bot]
) -> None:
    """A Telegram group upgraded to a supergroup while it waited for the model: the start moves its
    messages to the new id (bot/session_moves.py). The wait record stayed under the old id, so the start
    ended it as answered and the first failed try told the chat a second time about the same messages."""
    model = Model(server)
    async with bot_on(dispatcher=PATIENT) as before:
        assert await before.say("hello?") == NOTICE
    state = tmp_path / "state"
    await record_move(state, SID, "test:c2")
    await carry_moves(state, JsonSessionStore(tmp_path / "sessions"), None, inbox_dir=tmp_path / "inbox")
    async with bot_on(dispatcher=QUICK) as after:
        assert await after.dispatcher.recover() == 1
        await wait_until(lambda: len(server.requests) >= 4)  # tried again after the start, still down
        assert texts(after) == []
        model.down = False
        [answer] = await after.channel.wait_for(1)
        assert (answer.chat_id, answer.text) == ("c2", "echo: hello?")
        await inbox_done(tmp_path)
