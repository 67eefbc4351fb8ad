"""LLMClient corner cases driven through httpx.MockTransport (shapes the fake server never sends)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import bot.llm
from bot.catalog import ModelCatalog
from bot.config import LLMSettings
from bot.domain import Message, Role
from bot.errors import ConfigError, LLMUnavailable
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
    assert set(bot.llm.__all__) == public | {"llm_http_client"}
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
