"""An answer that never ends is cut at the size limits (bot/llm/limits.py), not read until out of memory.

Each test runs against the fake server scripted to send more than a limit allows and then hang, the
answer still open; a guard fails the test if the client waits that out instead of stopping at the limit.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pytest

from bot.domain import Message, Role
from bot.errors import LLMBadResponse, plain_reason
from bot.llm import ChatRequest
from bot.llm.limits import MAX_BODY_BYTES, MAX_EVENT_CHARS, MAX_STREAMED_CHARS, MiB
from tests.fakes.llm_server import FakeLLMServer, FakeReply

both = pytest.mark.parametrize("api", ["openai", "anthropic"])
MODELS = {"openai": "gpt-4.1-mini", "anthropic": "claude-haiku-4-5"}
OTHER = {"openai": "claude-haiku-4-5", "anthropic": "gpt-4.1-mini"}
HUNG = 60.0  # how long the fake hangs once it has sent too much; every test must finish long before


def ask() -> ChatRequest:
    return ChatRequest(messages=(Message(Role.USER, "hi"),))


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


async def released(server: FakeLLMServer) -> None:
    """The connection was dropped: the fake's handler, hanging mid-answer, was ended by it."""
    async with asyncio.timeout(5):
        while server.in_flight:
            await asyncio.sleep(0.01)


@both
async def test_a_body_past_the_limit_is_a_bad_response_and_the_next_model_answers(
    make_client: Any, server: FakeLLMServer, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    llm, sleeps = make_client(api, timeout=30.0, fallback_models=[OTHER[api]])
    server.script(FakeReply(flood=MAX_BODY_BYTES + MiB, stall=HUNG), FakeReply(text="from the fallback"))
    async with asyncio.timeout(20):
        response = await llm.chat(ask())
    assert response.content == "from the fallback" and sleeps.calls == []  # not tried again: failover
    assert llm.stats.failures_by == {(MODELS[api], "bad_response"): 1} and llm.stats.failovers == 1
    [line] = logged(caplog, "llm_answer_too_large")
    assert line["model"] == MODELS[api] and line["sent"] == "a body over 32 MiB"
    assert f"MEMBOT_LLM__{api.upper()}__BASE_URL" in str(line["fix"])
    await released(server)


@both
@pytest.mark.parametrize("grows", ["text", "arguments"])
async def test_a_stream_that_grows_past_the_limit_is_cut_and_closed(
    make_client: Any, server: FakeLLMServer, api: str, grows: str, caplog: pytest.LogCaptureFixture
) -> None:
    llm, _ = make_client(api, fallback_models=[OTHER[api]])
    calls = [("write", {})] if grows == "arguments" else []
    server.script(FakeReply(flood=MAX_STREAMED_CHARS + MiB, stall=HUNG, tool_calls=calls))
    shown = 0
    async with asyncio.timeout(20):
        with pytest.raises(LLMBadResponse, match="more than any model writes") as info:
            async for event in llm.stream(ask()):
                shown += len(event.text) if event.kind == "text" else 0
    assert shown <= MAX_STREAMED_CHARS
    # Part of the answer was shown (a call's name, at least): the error is raised as it is, like any
    # failure mid-answer, and the user reads the words of an unusable answer.
    assert len(server.requests) == 1
    assert plain_reason(type(info.value)) == "the AI model sent an answer that could not be used"
    [line] = logged(caplog, "llm_answer_too_large")
    assert line["sent"] == "over 8 Mi characters" and "BASE_URL" in str(line["fix"])
    await released(server)


@both
@pytest.mark.parametrize("flood_as", ["line", "event"])
async def test_a_stream_line_or_event_that_never_ends_is_cut_and_the_next_model_answers(
    make_client: Any,
    server: FakeLLMServer,
    api: str,
    flood_as: Literal["line", "event"],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Nothing of it counts as text until its line, or its event, ends: it was gathered without limit.
    llm, _ = make_client(api, fallback_models=[OTHER[api]])
    flood = FakeReply(flood=MAX_EVENT_CHARS + MiB, stall=HUNG, flood_as=flood_as)
    server.script(flood, FakeReply(text="from the fallback"))
    async with asyncio.timeout(20):
        events = [event async for event in llm.stream(ask())]
    done = events[-1].response
    assert done is not None and done.content == "from the fallback"
    assert llm.stats.failures_by == {(MODELS[api], "bad_response"): 1} and llm.stats.failovers == 1
    [line] = logged(caplog, "llm_answer_too_large")
    assert line["sent"] == ("a line" if flood_as == "line" else "an event") + " over 32 Mi characters"
    await released(server)
