"""The fake LLM server is honest: it refuses what the real APIs refuse, so translator bugs surface."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.fakes.llm_server import FakeLLMServer, FakeReply

ANTHROPIC_HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
USE = {"type": "tool_use", "id": "tu1", "name": "f", "input": {}}
RESULT = {"type": "tool_result", "tool_use_id": "tu1", "content": "ok"}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
KIMI_USE = {**USE, "id": "functions.f:0"}  # as Kimi K2 on vLLM names its calls: refused by Anthropic
LONG_CALL = {**CALL, "id": "c" * 41}  # OpenAI takes ids of at most 40 characters


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


async def post(server: FakeLLMServer, api: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        if api == "anthropic":
            return await http.post(
                f"{server.anthropic_base_url}/v1/messages",
                json=body,
                headers={**ANTHROPIC_HEADERS, **headers},
            )
        return await http.post(f"{server.openai_base_url}/chat/completions", json=body, headers=headers)


def claude(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-haiku-4-5", "max_tokens": 10, "messages": messages, **extra}


def gpt(messages: list[dict[str, Any]], model: str = "gpt-4.1-mini", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": messages, **extra}


@pytest.mark.parametrize(
    "body",
    [
        {"model": "claude-haiku-4-5", "messages": [user("hi")]},  # no max_tokens
        claude([assistant("hi")]),
        claude([user("a"), user("b")]),
        claude([{"role": "system", "content": "s"}, user("hi")]),
        claude([user([RESULT])]),
        claude([user("go"), assistant([USE]), user("no result")]),
        claude([user("go"), assistant([{**USE, "input": "{}"}]), user([RESULT])]),
        claude([user("go"), assistant([USE]), user([{"type": "text", "text": "x"}, RESULT])]),
        claude([user([{"type": "text", "text": "  "}])]),
        claude([user("go"), assistant([USE])]),
        claude([user("go"), assistant([USE, USE]), user([RESULT, RESULT])]),  # tool_use ids must be unique
        claude([user("go"), assistant([USE]), user([RESULT]), assistant([USE]), user([RESULT])]),
        claude([user("go"), assistant([KIMI_USE]), user([{**RESULT, "tool_use_id": KIMI_USE["id"]}])]),
        claude([user("hi")], temperature=1.5),
        claude([user([{"type": "image", "source": {"type": "url"}}])]),
    ],
)
async def test_anthropic_refuses_what_the_real_api_refuses(
    server: FakeLLMServer, body: dict[str, Any]
) -> None:
    response = await post(server, "anthropic", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_anthropic_needs_key_and_version(server: FakeLLMServer) -> None:
    assert (await post(server, "anthropic", claude([user("hi")]), **{"x-api-key": ""})).status_code == 401
    response = await post(server, "anthropic", claude([user("hi")]), **{"anthropic-version": "2020-01-01"})
    assert response.status_code == 400


async def test_anthropic_accepts_a_proper_tool_exchange(server: FakeLLMServer) -> None:
    body = claude(
        [
            user("go"),
            assistant([{"type": "text", "text": "ok"}, USE]),
            user([RESULT, {"type": "text", "text": "and?"}]),
        ]
    )
    response = await post(server, "anthropic", body)
    assert response.status_code == 200 and response.json()["content"][0]["text"] == "echo: and?"


@pytest.mark.parametrize(
    "body",
    [
        gpt([]),
        gpt([{"role": "tool", "tool_call_id": "c1", "content": "x"}]),
        gpt([user("go"), assistant(None, tool_calls=[CALL]), user("next")]),
        gpt([user("go"), assistant(None, tool_calls=[{**CALL, "function": {"name": "f", "arguments": {}}}])]),
        gpt([user("go"), assistant(None)]),
        gpt([user("hi")], stream_options={"include_usage": True}),
        gpt([user("hi")], model="gpt-5", temperature=0.5),
        gpt([user("hi")], model="gpt-5", max_tokens=10),
        gpt([user([{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}])]),
        gpt(
            [
                user("go"),
                assistant(None, tool_calls=[LONG_CALL]),
                {"role": "tool", "tool_call_id": "c" * 41, "content": "r"},
            ]
        ),
    ],
)
async def test_openai_refuses_what_the_real_api_refuses(server: FakeLLMServer, body: dict[str, Any]) -> None:
    response = await post(server, "openai", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_openai_accepts_a_proper_tool_exchange(server: FakeLLMServer) -> None:
    body = gpt(
        [
            user("go"),
            assistant(None, tool_calls=[CALL]),
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ]
    )
    response = await post(server, "openai", body)
    assert response.status_code == 200
    assert response.json()["usage"]["prompt_tokens"] > 0


async def test_openai_key_is_checked_when_configured() -> None:
    async with FakeLLMServer(openai_api_key="sk-right") as server:
        assert (await post(server, "openai", gpt([user("hi")]))).status_code == 401
        response = await post(server, "openai", gpt([user("hi")]), authorization="Bearer sk-right")
        assert response.status_code == 200


async def test_a_slow_reply_stops_when_the_client_gives_up(server: FakeLLMServer) -> None:
    server.script(FakeReply(text="late", delay=60))
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(f"{server.openai_base_url}/chat/completions", json=gpt([user("hi")]), timeout=0.2)
    async with asyncio.timeout(10):
        while server.in_flight:
            await asyncio.sleep(0.01)


async def test_responder_answers_when_nothing_is_scripted(server: FakeLLMServer) -> None:
    server.responder = lambda api, body: FakeReply(text=f"{api}:{len(body['messages'])}")
    server.script(FakeReply(text="scripted first"))
    first = await post(server, "openai", gpt([user("hi")]))
    second = await post(server, "anthropic", claude([user("hi")]))
    assert first.json()["choices"][0]["message"]["content"] == "scripted first"
    assert second.json()["content"][0]["text"] == "anthropic:1"
    assert [r.api for r in server.requests] == ["openai", "anthropic"] and server.scripted == 0


SYSTEM = {"role": "system", "content": "be brief"}
TOOL_RESULT = {"role": "tool", "tool_call_id": "c1", "content": "ok"}


@pytest.mark.parametrize(
    "messages",
    [
        [SYSTEM, user("a"), user("b")],  # after /stop: a question without an answer, then the next
        [SYSTEM, {"role": "system", "content": "[summary]"}, user("a")],  # after /compact
        [SYSTEM, user("a"), assistant("x"), assistant("y")],
        [SYSTEM, assistant("hello"), user("a")],
    ],
)
async def test_strict_template_mode_refuses_what_strict_chat_templates_refuse(messages: Any) -> None:
    async with FakeLLMServer(strict_template=True) as strict:
        response = await post(strict, "openai", gpt(messages))
        assert response.status_code == 400, response.text
    async with FakeLLMServer() as lenient:  # OpenAI itself accepts all of them
        assert (await post(lenient, "openai", gpt(messages))).status_code == 200


async def test_strict_template_mode_accepts_alternation_with_tool_results() -> None:
    messages = [
        SYSTEM,
        user("a"),
        assistant(None, tool_calls=[CALL]),
        TOOL_RESULT,
        assistant("done"),
        user("b"),
    ]
    async with FakeLLMServer(strict_template=True) as strict:
        assert (await post(strict, "openai", gpt(messages))).status_code == 200
