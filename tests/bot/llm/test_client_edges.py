"""LLMClient corner cases driven through httpx.MockTransport (shapes the fake server never sends)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

import bot.llm
from bot.catalog import ModelCatalog
from bot.config import LLMSettings
from bot.domain import Message, Role
from bot.errors import ConfigError, LLMAuthError, LLMBadResponse, LLMRateLimited, LLMUnavailable
from bot.llm import ChatRequest, LLMClient, StreamEvent

REQUEST = ChatRequest(messages=(Message(Role.USER, "hi"),))


def sse_body(*chunks: Any) -> bytes:
    return "".join(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks).encode()


def text_chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


async def stream_with(
    catalog: ModelCatalog, handler: Callable[[httpx.Request], httpx.Response], **settings: Any
) -> list[StreamEvent]:
    values = {"model": "llama3.1", "openai": {"base_url": "http://127.0.0.1:1/v1"}, **settings}
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        llm = LLMClient(LLMSettings.model_validate(values), catalog, http, sleep=sleep)
        return [event async for event in llm.stream(REQUEST)]


def test_public_surface() -> None:
    public = {name for name in vars(bot.llm) if not name.startswith("_") and name[0].isupper()}
    assert set(bot.llm.__all__) == public | {
        "llm_http_client",
        "check_base_url",
        "request_tokens",
        "schemas_text",
    }
    assert {"LLMClient", "ChatRequest", "ChatResponse", "ToolSpec", "StreamEvent"} <= public


@pytest.mark.parametrize("url", ["localhost:11434/v1", "ftp://host/v1", "http://", "http://[::1"])
async def test_a_bad_base_url_stops_start_up_naming_the_setting(
    catalog: ModelCatalog, http: httpx.AsyncClient, url: str
) -> None:
    settings = LLMSettings.model_validate({"openai": {"base_url": url}})
    with pytest.raises(ConfigError, match="MEMBOT_LLM__OPENAI__BASE_URL"):
        LLMClient(settings, catalog, http)


async def test_a_server_that_ignores_stream_true_still_streams(catalog: ModelCatalog) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream"] is True
        message = {
            "content": "whole answer",
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
        }
        return httpx.Response(200, json={"choices": [{"message": message, "finish_reason": "tool_calls"}]})

    events = await stream_with(catalog, handler)
    assert [(e.kind, e.text) for e in events[:-1]] == [("text", "whole answer"), ("tool_call", "f")]
    final = events[-1].response
    assert final is not None and final.content == "whole answer" and final.tool_calls[0].name == "f"


async def test_a_stream_without_done_marker_is_complete_after_finish_reason(catalog: ModelCatalog) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = sse_body(text_chunk("a"), text_chunk("b", finish="stop"))
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    events = await stream_with(catalog, handler)
    final = events[-1].response
    assert final is not None and final.content == "ab" and final.stop_reason == "stop"


async def test_a_stream_cut_short_after_output_is_an_error(catalog: ModelCatalog) -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(
            200, content=sse_body(text_chunk("par")), headers={"content-type": "text/event-stream"}
        )

    with pytest.raises(LLMUnavailable, match="before the answer was complete"):
        await stream_with(catalog, handler)
    assert len(calls) == 1  # part of an answer was shown: no silent second try


async def test_a_stream_refused_with_429_is_retried(catalog: ModelCatalog) -> None:
    answers = [
        httpx.Response(429, json={"error": {"message": "slow down"}}, headers={"retry-after": "1"}),
        httpx.Response(
            200,
            content=sse_body(text_chunk("ok", "stop"), "[DONE]"),
            headers={"content-type": "text/event-stream"},
        ),
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        return answers.pop(0)

    events = await stream_with(catalog, handler)
    assert events[-1].response is not None and events[-1].response.content == "ok"


@pytest.mark.parametrize("count", ["n/a", 2.5, [3], {"n": 3}, True])
async def test_an_answer_whose_usage_count_is_no_number_is_taken_and_the_count_logged(
    catalog: ModelCatalog, count: Any
) -> None:
    """A usage count that is no number ("n/a", a fraction, a list) is bookkeeping gone wrong, not a bad
    answer: the answer is taken (not thrown away and paid for again at the fallback), the count is our
    own estimate (bot/llm/estimates.py), and a warning names the field and the type that came."""
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(json.loads(request.content)["model"])
        if request.url.path.endswith("/messages"):  # the primary, on the Anthropic wire
            content = [{"type": "text", "text": "primary"}]
            usage = {"input_tokens": count, "output_tokens": 3}
            return httpx.Response(200, json={"content": content, "stop_reason": "end_turn", "usage": usage})
        return httpx.Response(200, json={"choices": [{"message": {"content": "from the fallback"}}]})

    settings = LLMSettings.model_validate(
        {
            "model": "claude-haiku-4-5",
            "fallback_models": ["gpt-4.1-mini"],
            "max_retries": 0,
            "openai": {"base_url": "http://127.0.0.1:1/v1", "api_key": "k"},
            "anthropic": {"base_url": "http://127.0.0.1:2", "api_key": "k"},
        }
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        with capture_logs() as logs:
            reply = await LLMClient(settings, catalog, http).chat(REQUEST)

    assert reply.content == "primary" and asked == ["claude-haiku-4-5"]
    assert (
        reply.usage.input_tokens > 0 and reply.usage.output_tokens == 3 and reply.usage.estimated_calls == 1
    )
    warned = [e for e in logs if e["event"] == "llm_usage_malformed"]
    assert [(e["field"], e["value_type"], e["model"]) for e in warned] == [
        ("input_tokens", type(count).__name__, "claude-haiku-4-5")
    ]


@pytest.mark.parametrize(
    "chunk",
    [
        {"choices": ["oops"]},
        {"choices": [{"delta": "text"}]},
        {"choices": [{"delta": {"tool_calls": ["x"]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": "f"}]}}]},
    ],
)
async def test_a_streamed_chunk_of_the_wrong_shape_is_a_bad_answer(
    catalog: ModelCatalog, chunk: dict[str, Any]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = sse_body(chunk, "[DONE]")
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    with pytest.raises(LLMBadResponse, match="could not be read"):
        await stream_with(catalog, handler)


async def test_arguments_sent_as_an_object_are_kept_as_json(catalog: ModelCatalog) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        call = {"id": "c", "function": {"name": "f", "arguments": {"tz": "UTC", "ok": True}}}
        return httpx.Response(200, json={"choices": [{"message": {"content": "", "tool_calls": [call]}}]})

    events = await stream_with(catalog, handler)
    final = events[-1].response
    assert final is not None and json.loads(final.tool_calls[0].arguments) == {"tz": "UTC", "ok": True}


async def test_an_error_sent_with_http_200_keeps_its_message_and_is_retried(catalog: ModelCatalog) -> None:
    """Proxies (OpenRouter) send an overload as a 200 with an error body: a temporary failure with the
    provider's words, not "an answer without the expected fields"."""
    answers = [
        httpx.Response(200, json={"error": {"message": "Upstream provider overloaded", "code": 529}}),
        httpx.Response(200, json={"choices": [{"message": {"content": "fine now"}}]}),
    ]
    events = await stream_with(catalog, lambda request: answers.pop(0), max_retries=1)

    final = events[-1].response
    assert final is not None and final.content == "fine now" and answers == []


async def test_an_error_sent_with_http_200_says_what_the_provider_said(catalog: ModelCatalog) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"error": {"message": "Model gpt-9 does not exist", "code": 404}})

    with pytest.raises(LLMBadResponse, match="gpt-9 does not exist"):
        await stream_with(catalog, handler)


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        ({"message": "slow down", "code": "429"}, LLMRateLimited),  # the status as a string
        ({"message": "slow down", "type": "rate_limit_error"}, LLMRateLimited),  # by its type alone
        ({"message": "no such key", "code": 401}, LLMAuthError),
        ({"message": "odd", "code": 200, "type": "overloaded_error"}, LLMUnavailable),  # no error status
        ({"message": "odd", "code": "E42"}, LLMUnavailable),  # a code that is no status: 500
        ({"message": "odd", "code": "\u00b2"}, LLMUnavailable),  # "²": a digit, but no number (ValueError)
        ("something broke", LLMUnavailable),  # a bare string
    ],
)
async def test_an_error_sent_with_http_200_is_classified_by_its_code_then_its_type(
    catalog: ModelCatalog, error: object, raised: type[Exception]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"error": error})

    with pytest.raises(raised):
        await stream_with(catalog, handler)


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_names_where_it_leads_and_the_setting(catalog: ModelCatalog, status: int) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"location": "https://llm.example/v1/chat/completions"})

    with pytest.raises(LLMBadResponse, match=r"redirected .*https://llm.example/v1.*BASE_URL"):
        await stream_with(catalog, handler)
