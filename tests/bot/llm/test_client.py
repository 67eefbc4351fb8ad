"""LLMClient against the local fake server, for both wire formats."""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from bot.catalog import load_catalog
from bot.config import LLMSettings
from bot.domain import Message, Role, ToolCall
from bot.errors import (
    LLMAuthError,
    LLMBadResponse,
    LLMContextOverflow,
    LLMTimeout,
    LLMUnavailable,
)
from bot.llm import ChatRequest, LLMClient, ToolSpec
from bot.llm.client import _transport_error, retry_after_seconds
from tests.fakes.llm_server import FakeLLMServer, FakeReply

MODELS = {"openai": "gpt-4.1-mini", "anthropic": "claude-haiku-4-5"}
CATALOG = load_catalog()


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@pytest.fixture
async def server() -> AsyncIterator[FakeLLMServer]:
    async with FakeLLMServer() as llm:
        yield llm


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def client(server: FakeLLMServer, http: httpx.AsyncClient, api: str, **settings: Any) -> tuple[LLMClient, Sleeps]:
    base: dict[str, Any] = {
        "model": MODELS[api],
        "openai": {"base_url": server.openai_base_url, "api_key": "sk-test-openai"},
        "anthropic": {"base_url": server.anthropic_base_url, "api_key": "sk-ant-test"},
        "timeout": 5.0,
    }
    base.update(settings)
    sleeps = Sleeps()
    return LLMClient(LLMSettings.model_validate(base), CATALOG, http, sleep=sleeps, rng=lambda: 0.5), sleeps


def ask(text: str, **kw: Any) -> ChatRequest:
    return ChatRequest(messages=(Message(Role.USER, text),), system="be brief", **kw)


WEATHER = ToolSpec("weather", "Weather for a city", {"type": "object", "properties": {"city": {"type": "string"}}})

both = pytest.mark.parametrize("api", ["openai", "anthropic"])


@both
async def test_plain_chat_with_usage_and_cost(server: FakeLLMServer, http: httpx.AsyncClient, api: str) -> None:
    llm, _ = client(server, http, api)
    server.script(FakeReply(text="hello there", usage=(1000, 50)))
    response = await llm.chat(ask("hi"))
    assert response.content == "hello there"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (1000, 50)
    info = CATALOG.get(MODELS[api])
    assert response.usage.cost_usd == pytest.approx((1000 * info.input_price + 50 * info.output_price) / 1e6)
    body = server.requests[-1].body
    if api == "anthropic":
        assert body["system"] == "be brief" and body["max_tokens"] > 0
        assert server.requests[-1].headers["x-api-key"] == "sk-ant-test"
    else:
        assert body["messages"][0] == {"role": "system", "content": "be brief"}
        assert server.requests[-1].headers["Authorization"] == "Bearer sk-test-openai"


@both
async def test_tool_call_round_trip_is_accepted_by_the_api(server: FakeLLMServer, http: httpx.AsyncClient, api: str) -> None:
    llm, _ = client(server, http, api)
    server.script(FakeReply(tool_calls=[("weather", {"city": "Oslo"}), ("weather", '{"city": "Rome"}')]))
    first = await llm.chat(ask("weather?", tools=(WEATHER,)))
    assert [c.name for c in first.tool_calls] == ["weather", "weather"]
    assert json.loads(first.tool_calls[0].arguments) == {"city": "Oslo"}
    history = (
        Message(Role.USER, "weather?"),
        Message(Role.ASSISTANT, "", tool_calls=first.tool_calls),
        *(Message(Role.TOOL, "sunny", tool_call_id=c.id, name=c.name) for c in first.tool_calls),
    )
    server.script(FakeReply(text="Both sunny."))
    second = await llm.chat(ChatRequest(messages=history, tools=(WEATHER,)))
    assert second.content == "Both sunny."  # the fake validated call ids and ordering like the real API


@both
async def test_streaming_text_and_tool_calls(server: FakeLLMServer, http: httpx.AsyncClient, api: str) -> None:
    llm, _ = client(server, http, api)
    server.script(FakeReply(text="streamed answer here", tool_calls=[("weather", {"city": "Paris"})], usage=(10, 5)))
    texts, done = [], None
    async for event in llm.stream(ask("go", tools=(WEATHER,))):
        if event.kind == "text":
            texts.append(event.text)
        elif event.kind == "done":
            done = event.response
    assert "".join(texts) == "streamed answer here" and len(texts) > 1
    assert done is not None and done.content == "streamed answer here"
    assert [(c.name, json.loads(c.arguments)) for c in done.tool_calls] == [("weather", {"city": "Paris"})]
    assert done.usage.input_tokens == 10 and done.usage.output_tokens == 5


@both
async def test_rate_limit_honours_retry_after(server: FakeLLMServer, http: httpx.AsyncClient, api: str) -> None:
    llm, sleeps = client(server, http, api)
    server.script(FakeReply(status=429, headers={"retry-after": "2.5"}), FakeReply(text="ok"))
    assert (await llm.chat(ask("x"))).content == "ok"
    assert sleeps.calls == [2.5]
    assert llm.stats.retries == 1


async def test_retry_after_ms_wins_and_is_capped(server: FakeLLMServer, http: httpx.AsyncClient) -> None:
    llm, sleeps = client(server, http, "openai", retry_max_delay=1.0)
    server.script(
        FakeReply(status=429, headers={"retry-after-ms": "150", "retry-after": "9"}),
        FakeReply(status=503, headers={"retry-after": "60"}),
        FakeReply(text="ok"),
    )
    assert (await llm.chat(ask("x"))).content == "ok"
    assert sleeps.calls == [0.15, 1.0]


@pytest.mark.parametrize("status", [500, 529, 408])
async def test_transient_errors_are_retried_with_backoff(server: FakeLLMServer, http: httpx.AsyncClient, status: int) -> None:
    llm, sleeps = client(server, http, "anthropic")
    server.script(FakeReply(status=status), FakeReply(status=status), FakeReply(text="finally"))
    assert (await llm.chat(ask("x"))).content == "finally"
    assert sleeps.calls == [0.5, 1.0]  # base 0.5 * 2**attempt * (0.5 + rng=0.5)


@both
async def test_auth_errors_are_not_retried(server: FakeLLMServer, http: httpx.AsyncClient, api: str) -> None:
    llm, sleeps = client(server, http, api, fallback_models=["gpt-4o-mini"])
    server.script(FakeReply(status=401))
    with pytest.raises(LLMAuthError, match="API_KEY"):
        await llm.chat(ask("x"))
    assert sleeps.calls == [] and len(server.requests) == 1


async def test_spend_limit_429_is_not_retried(server: FakeLLMServer, http: httpx.AsyncClient) -> None:
    llm, sleeps = client(server, http, "openai")
    error = {"error": {"message": "You exceeded your current quota", "type": "insufficient_quota", "code": "insufficient_quota"}}
    server.script(FakeReply(status=429, error=error))
    with pytest.raises(LLMAuthError, match="quota"):
        await llm.chat(ask("x"))
    assert sleeps.calls == []


async def test_failover_to_the_next_model(server: FakeLLMServer, http: httpx.AsyncClient) -> None:
    llm, _ = client(server, http, "openai", max_retries=1, fallback_models=["claude-haiku-4-5"])
    server.script(FakeReply(status=503), FakeReply(status=503), FakeReply(text="from claude"))
    response = await llm.chat(ask("x"))
    assert response.content == "from claude"
    assert [r.api for r in server.requests] == ["openai", "openai", "anthropic"]
    assert llm.stats.failovers == 1


async def test_context_overflow_is_its_own_error(server: FakeLLMServer, http: httpx.AsyncClient) -> None:
    llm, sleeps = client(server, http, "anthropic")
    server.script(FakeReply(status=400, error={"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 300000 tokens > 200000 maximum"}}))
    with pytest.raises(LLMContextOverflow):
        await llm.chat(ask("x"))
    assert sleeps.calls == []


async def test_timeout_is_retried_then_reported(server: FakeLLMServer, http: httpx.AsyncClient) -> None:
    llm, sleeps = client(server, http, "openai", max_retries=1)
    server.script(FakeReply(text="late", delay=2), FakeReply(text="late", delay=2))
    with pytest.raises(LLMTimeout):
        await llm.chat(ask("x", timeout=0.2))
    assert len(sleeps.calls) == 1


async def test_malformed_json_is_a_bad_response(server: FakeLLMServer, http: httpx.AsyncClient) -> None:
    llm, _ = client(server, http, "openai")
    server.script(FakeReply(malformed=True))
    with pytest.raises(LLMBadResponse, match="malformed"):
        await llm.chat(ask("x"))


@both
async def test_mid_stream_failure_after_output_is_raised(server: FakeLLMServer, http: httpx.AsyncClient, api: str) -> None:
    llm, _ = client(server, http, api)
    server.script(FakeReply(text="a fairly long answer that will break", stream_error_after=1))
    seen = []
    with pytest.raises(LLMUnavailable):
        async for event in llm.stream(ask("x")):
            seen.append(event)
    assert seen and seen[0].kind == "text"


async def test_unreachable_server_is_unavailable(http: httpx.AsyncClient) -> None:
    settings = LLMSettings.model_validate({"openai": {"base_url": "http://127.0.0.1:9/v1"}, "max_retries": 0})
    llm = LLMClient(settings, CATALOG, http)
    with pytest.raises(LLMUnavailable, match="cannot reach"):
        await llm.chat(ask("x"))
    assert llm.stats.last_ok is False


async def test_images_reach_both_apis(server: FakeLLMServer, http: httpx.AsyncClient) -> None:
    from bot.domain import ImagePart

    message = Message(Role.USER, "what is this?", images=(ImagePart("image/png", "iVBORw0KGgo="),))
    for api in ("openai", "anthropic"):
        llm, _ = client(server, http, api)
        await llm.chat(ChatRequest(messages=(message,)))
    openai_content = server.requests[0].body["messages"][0]["content"]
    assert openai_content[1]["image_url"]["url"].startswith("data:image/png;base64,")
    anthropic_content = server.requests[1].body["messages"][0]["content"]
    assert anthropic_content[1]["source"] == {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


def test_every_httpx_error_is_mapped() -> None:
    """STYLE 10: a new httpx exception class must not slip through unmapped."""
    classes = [c for _, c in inspect.getmembers(httpx, inspect.isclass) if issubclass(c, httpx.HTTPError)]
    assert len(classes) > 15
    request = httpx.Request("GET", "http://x")
    for cls in classes:
        if cls is httpx.HTTPStatusError:
            exc: httpx.HTTPError = cls("x", request=request, response=httpx.Response(500, request=request))
        else:
            exc = cls("x")
        mapped = _transport_error(exc, "m")
        expected = LLMTimeout if issubclass(cls, httpx.TimeoutException) else LLMUnavailable
        assert isinstance(mapped, expected), cls


def test_retry_after_forms() -> None:
    h = httpx.Headers
    assert retry_after_seconds(h({"retry-after": "3"})) == 3.0
    assert retry_after_seconds(h({"retry-after": "0.25"})) == 0.25
    assert retry_after_seconds(h({"retry-after-ms": "1500"})) == 1.5
    assert retry_after_seconds(h({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}), now=1445412480.0) == 10.0
    assert retry_after_seconds(h({"retry-after": "soon"})) is None
    assert retry_after_seconds(h({})) is None


def test_translators_keep_tool_pairs_for_anthropic() -> None:
    from bot.llm import anthropic

    calls = (ToolCall("t1", "a", "{bad json"), ToolCall("t2", "b", "{}"))
    system, messages = anthropic._messages(
        ChatRequest(
            messages=(
                Message(Role.SYSTEM, "[Conversation summary] earlier"),
                Message(Role.ASSISTANT, "continuing"),
                Message(Role.USER, "q"),
                Message(Role.ASSISTANT, "", tool_calls=calls),
                Message(Role.TOOL, "r1", tool_call_id="t1"),
                Message(Role.TOOL, "r2", tool_call_id="t2"),
            ),
            system="base",
        )
    )
    assert system == "base\n\n[Conversation summary] earlier"
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[3]["content"][0]["input"] == {}  # invalid JSON arguments become an empty object
    assert [b["tool_use_id"] for b in messages[4]["content"]] == ["t1", "t2"]
