"""A hung model server costs seconds, not minutes: first-byte and idle limits, timeouts retried once.

Each test runs against the fake server scripted to hang (``delay``: before the answer starts;
``stall_after``: in the middle of it) for a minute; a guard fails the test if the client waits that out.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

from bot.domain import Message, Role
from bot.errors import LLMTimeout
from bot.llm import ChatRequest, ChatResponse, LLMClient
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.llm_wire import pieces

both = pytest.mark.parametrize("api", ["openai", "anthropic"])
HUNG = 60.0  # how long the fake hangs; every test must finish long before
FAST = {"first_byte_timeout": 0.3, "idle_timeout": 0.3, "max_retries": 3}


def ask(text: str = "hi") -> ChatRequest:
    return ChatRequest(messages=(Message(Role.USER, text),))


async def streamed(llm: LLMClient, request: ChatRequest) -> tuple[str, ChatResponse | None]:
    text, final = "", None
    async for event in llm.stream(request):
        text += event.text if event.kind == "text" else ""
        final = event.response or final
    return text, final


@both
async def test_a_stream_that_never_starts_fails_after_the_first_byte_limit_retried_once(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    llm, sleeps = make_client(api, **FAST)
    server.script(*[FakeReply(text="late", delay=HUNG)] * 4)
    async with asyncio.timeout(10):
        with pytest.raises(LLMTimeout, match=r"did not start answering within 0\.3 s"):
            await streamed(llm, ask())
    # max_retries=3, but a timeout is tried twice only (counted by the client: on a loaded machine the
    # second try can give up before the fake has read it).
    assert llm.stats.failures == 2 and len(sleeps.calls) == 1


@both
async def test_a_stream_that_goes_silent_midway_fails_after_the_idle_limit(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    llm, _ = make_client(api, **FAST)
    server.script(FakeReply(text="the first words and then nothing", stall_after=4, stall=HUNG))
    shown = ""
    async with asyncio.timeout(10):
        with pytest.raises(LLMTimeout, match=r"went silent for 0\.3 s"):
            async for event in llm.stream(ask()):
                shown += event.text
    assert shown  # part of the answer was shown, so it is not tried again
    assert len(server.requests) == 1


@both
async def test_an_answer_whole_before_a_silence_is_taken_at_the_idle_limit(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    """Anthropic's ``message_delta`` (the stop reason) came, every block closed, then silence, not
    ``message_stop``, as a proxy that holds the connection sends it: the whole answer was thrown away at
    the idle limit and asked for again (paid twice). It is taken there, and logged. (OpenAI: the finish
    reason and the usage came, then silence, not ``[DONE]``.)"""
    llm, sleeps = make_client(api, **FAST)
    answer = "the whole answer, every word of it"
    if api == "anthropic":  # message_start, ping, block start, the deltas, block stop, message_delta
        before_end, end = 3 + len(pieces(answer)) + 2, "llm_stream_without_message_stop"
    else:  # the role chunk, the deltas, the finish reason, the usage
        before_end, end = 1 + len(pieces(answer)) + 2, None
    server.script(
        FakeReply(text=answer, usage=(20, 7), stall_after=before_end, stall=HUNG), FakeReply(text="twice")
    )
    async with asyncio.timeout(10):
        with capture_logs() as logs:
            text, final = await streamed(llm, ask())
    assert text == answer and final is not None and final.content == answer
    assert final.stop_reason in ("end_turn", "stop") and final.usage.output_tokens == 7
    assert len(server.requests) == 1 and sleeps.calls == []
    warned = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert warned == ["llm_stream_silent_after_its_end", *([end] if end else [])]


async def test_a_silence_before_the_stop_reason_is_still_a_timeout(
    make_client: Any, server: FakeLLMServer
) -> None:
    """Every block closed but no ``message_delta`` yet: nothing says the answer is whole."""
    llm, _ = make_client("anthropic", **FAST)
    answer = "an answer that may go on"
    before_delta = 3 + len(pieces(answer)) + 1
    server.script(FakeReply(text=answer, stall_after=before_delta, stall=HUNG))
    async with asyncio.timeout(10):
        with pytest.raises(LLMTimeout, match=r"went silent for 0\.3 s"):
            await streamed(llm, ask())
    assert len(server.requests) == 1


@both
async def test_keep_alives_alone_do_not_keep_a_stalled_answer_open(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    """Comments (and pings) every 0.1 s kept a hung answer open until the turn's deadline (600 s)."""
    llm, _ = make_client(api, **FAST)
    server.script(
        FakeReply(text="the first words and then only pings", stall_after=4, stall=HUNG, keepalive=0.1)
    )
    async with asyncio.timeout(10):
        with pytest.raises(LLMTimeout, match=r"went silent for 0\.3 s"):
            async for _ in llm.stream(ask()):
                pass


@both
async def test_keep_alives_before_the_first_words_keep_a_thinking_model_waited_for(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    """A proxy's comments while a model thinks past the idle limit (OpenRouter's before a hidden-reasoning
    model's first words) ended the try as silent, and its retry the same way: the user got an apology."""
    llm, _ = make_client(api, **FAST)
    server.script(FakeReply(text="thought it over, and here it is", stall_after=0, stall=1.2, keepalive=0.1))
    async with asyncio.timeout(10):
        text, final = await streamed(llm, ask())
    assert text == "thought it over, and here it is"
    assert final is not None and final.content == text
    assert len(server.requests) == 1


@both
async def test_a_body_that_stalls_is_cut_by_the_idle_limit_and_the_retry_answers(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    llm, _ = make_client(api, **FAST)
    server.script(FakeReply(text="never whole", stall_after=20, stall=HUNG), FakeReply(text="second try"))
    async with asyncio.timeout(10):
        response = await llm.chat(ask())
    assert response.content == "second try" and len(server.requests) == 2
    assert llm.stats.failures_by == {(llm.model, "timeout"): 1}


async def test_a_hung_non_streamed_call_is_bounded_by_timeout_and_retried_once(
    make_client: Any, server: FakeLLMServer
) -> None:
    llm, sleeps = make_client("openai", timeout=0.3, max_retries=3)
    server.script(*[FakeReply(text="late", delay=HUNG)] * 4)
    async with asyncio.timeout(10):
        with pytest.raises(LLMTimeout, match=r"did not answer within 0\.3 s"):
            await llm.chat(ask())
    assert llm.stats.failures == 2 and len(sleeps.calls) == 1


async def test_a_pause_shorter_than_the_idle_limit_does_not_cut_the_stream(
    make_client: Any, server: FakeLLMServer
) -> None:
    llm, _ = make_client("openai", first_byte_timeout=1.0, idle_timeout=1.0)
    server.script(FakeReply(text="slow and steady wins", stall_after=2, stall=0.4))
    async with asyncio.timeout(10):
        text, final = await streamed(llm, ask())
    assert text == "slow and steady wins" and final is not None


@both
@pytest.mark.parametrize("status", [500, 200], ids=["error", "stream-ignored"])
async def test_a_body_read_whole_from_a_stream_request_is_bounded_by_the_timeout(
    make_client: Any, server: FakeLLMServer, api: str, status: int
) -> None:
    """Asked to stream, a server may answer with a whole body: an error, or the answer itself when it
    ignores ``stream``. A byte every 0.05 s kept each read within the idle limit, so only the turn's
    deadline (600 s) ended it, and every retry of a 5xx took as long again. Like any whole answer,
    it must be complete within ``llm.timeout``."""
    llm, _ = make_client(api, **{**FAST, "timeout": 0.5})
    server.script(*[FakeReply(text="dripped", status=status, drip=0.05, stall=HUNG)] * 4)
    async with asyncio.timeout(10):
        with pytest.raises(LLMTimeout, match=r"whole answer within 0\.5 s \(llm\.timeout\)"):
            await streamed(llm, ask())
    assert llm.stats.failures == 2  # a timeout is tried twice only
