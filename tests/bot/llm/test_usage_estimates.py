"""A call the server sent no token counts for is counted by our own counter, not as 0 tokens.

Some OpenAI-compatible servers ignore ``stream_options.include_usage`` (or send no ``usage`` at all),
and a stream taken whole at its stop reason may have lost the chunk that carried it: those calls
counted 0 tokens in the usage ledger and /status, so spend was under-reported without a word.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest
from structlog.testing import capture_logs

from bot.catalog import ModelCatalog
from bot.config import LLMSettings
from bot.domain import Message, Role
from bot.llm import ChatRequest, ChatResponse, LLMClient, ToolSpec
from bot.tokens import TokenCounter
from bot.usage import UsageLedger
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.llm_wire import pieces

MODELS = {"openai": "gpt-4.1-mini", "anthropic": "claude-haiku-4-5"}
WEATHER = ToolSpec(
    "weather", "Weather for a city", {"type": "object", "properties": {"city": {"type": "string"}}}
)
QUESTION = "What should I pack for a week of hiking in the Dolomites in late September? " * 6
ANSWER = "Layers: a warm fleece, a rain shell, good boots, and a hat for the cold mornings. " * 4


async def client(
    api: str, server: FakeLLMServer, http: httpx.AsyncClient, catalog: ModelCatalog, ledger: UsageLedger
) -> tuple[LLMClient, TokenCounter]:
    counter = await asyncio.to_thread(TokenCounter.offline, model=MODELS[api], provider=api)
    settings = LLMSettings.model_validate(
        {
            "model": MODELS[api],
            "openai": {"base_url": server.openai_base_url, "api_key": "sk-test-openai"},
            "anthropic": {"base_url": server.anthropic_base_url, "api_key": "sk-ant-test"},
            "timeout": 5.0,
        }
    )
    return LLMClient(settings, catalog, http, usage=ledger, counter=counter), counter


def request() -> ChatRequest:
    messages = (Message(Role.USER, QUESTION),)
    return ChatRequest(messages=messages, system="You are a helpful travel assistant.", tools=(WEATHER,))


async def answer(llm: LLMClient, stream: bool) -> ChatResponse:
    if not stream:
        return await llm.chat(request())
    events = [event async for event in llm.stream(request())]
    assert events[-1].kind == "done" and events[-1].response is not None
    return events[-1].response


def counted(counter: TokenCounter) -> tuple[int, int]:
    """What our counter makes of the request (its tool's JSON schema included) and of the answer."""
    asked = request()
    schema = json.dumps(
        {"name": WEATHER.name, "description": WEATHER.description, "parameters": WEATHER.parameters}
    )
    prompt = (
        counter.count_text(asked.system)
        + counter.messages_tokens(asked.messages)
        + counter.count_text(schema)
    )
    call = counter.count_text("weather") + counter.count_text('{"city": "Bolzano"}')
    return round(prompt * counter.prior), round((counter.count_text(ANSWER) + call) * counter.prior)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_server_that_sends_no_usage_is_counted_by_our_counter_and_said_once(
    server: FakeLLMServer,
    http: httpx.AsyncClient,
    catalog: ModelCatalog,
    tmp_path: Path,
    api: str,
    stream: bool,
) -> None:
    ledger = UsageLedger(tmp_path / "usage.json", tz=ZoneInfo("UTC"))
    llm, counter = await client(api, server, http, catalog, ledger)
    reply = FakeReply(text=ANSWER, tool_calls=[("weather", {"city": "Bolzano"})], no_usage=True)
    server.script(reply, reply)
    with capture_logs() as logs:
        first = await answer(llm, stream)
        second = await answer(llm, stream)
    prompt, said = counted(counter)
    for done in (first, second):
        assert done.usage.input_tokens == pytest.approx(prompt, rel=0.15)
        assert done.usage.output_tokens == pytest.approx(said, rel=0.15)
        assert done.usage.estimated_calls == 1 and done.usage.cost_usd > 0
    today = await ledger.day()
    assert today.input_tokens == first.usage.input_tokens + second.usage.input_tokens
    assert today.output_tokens == first.usage.output_tokens + second.usage.output_tokens
    assert today.calls == today.estimated_calls == 2
    missing = [e for e in logs if e["event"] == "llm_usage_missing"]
    assert len(missing) == 1 and missing[0]["model"] == MODELS[api], missing  # once per model
    assert "estimate" in missing[0]["hint"] and missing[0]["missing"] == ["input_tokens", "output_tokens"]
    await ledger.close()


async def test_a_stream_taken_at_its_finish_reason_before_the_usage_chunk_is_not_counted_as_nothing(
    server: FakeLLMServer, http: httpx.AsyncClient, catalog: ModelCatalog, tmp_path: Path
) -> None:
    """The body ended after the ``finish_reason`` chunk, before the usage chunk and ``[DONE]`` (as when
    a server holds the stream open and the idle limit takes the whole answer): estimated, not 0."""
    ledger = UsageLedger(tmp_path / "usage.json", tz=ZoneInfo("UTC"))
    llm, counter = await client("openai", server, http, catalog, ledger)
    before_usage = 1 + len(pieces(ANSWER)) + 1  # the role chunk, the text, the finish_reason chunk
    server.script(FakeReply(text=ANSWER, usage=(900, 80), end_after=before_usage))
    done = await answer(llm, stream=True)
    assert done.content == ANSWER and done.stop_reason == "stop"
    assert done.usage.input_tokens > 0 and done.usage.output_tokens == pytest.approx(
        round(counter.count_text(ANSWER) * counter.prior), rel=0.05
    )
    assert (await ledger.day()).output_tokens == done.usage.output_tokens
    await ledger.close()


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_server_that_counts_is_taken_at_its_word(
    server: FakeLLMServer, http: httpx.AsyncClient, catalog: ModelCatalog, tmp_path: Path, api: str
) -> None:
    ledger = UsageLedger(tmp_path / "usage.json", tz=ZoneInfo("UTC"))
    llm, _ = await client(api, server, http, catalog, ledger)
    server.script(FakeReply(text=ANSWER, usage=(1234, 56)))
    with capture_logs() as logs:
        done = await answer(llm, stream=True)
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.estimated_calls) == (1234, 56, 0)
    assert not [e for e in logs if e["event"] == "llm_usage_missing"]
    assert "estimated_calls" not in done.usage.to_dict()  # files without estimates stay as they were
    await ledger.close()
