"""JSON nested too deeply to decode, wherever a model server can send it, is a bad answer or a bad call,
never a ``RecursionError`` out of the client.

``json.loads`` gives up past about a thousand levels with ``RecursionError``, which is no
``ValueError``: the client's "malformed JSON" handling let it through, and a tool call's arguments kept
in the history failed every later request of the chat. Driven through httpx.MockTransport, since the
fake server cannot send what its own ``json.dumps`` refuses.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from bot.catalog import ModelCatalog
from bot.config import LLMSettings
from bot.domain import Message, Role, ToolCall
from bot.errors import LLMBadResponse, LLMError
from bot.llm import ChatRequest, LLMClient
from bot.llm.types import ChatResponse
from bot.memory.llm_json import parse_object
from tests.bot.llm.test_client_edges import stream_with

DEEP = "[" * 5000 + "]" * 5000
ANTHROPIC = {
    "model": "claude-haiku-4-5",
    "max_retries": 0,
    "anthropic": {"base_url": "http://127.0.0.1:2", "api_key": "k"},
}
OPENAI = {"model": "llama3.1", "max_retries": 0, "openai": {"base_url": "http://127.0.0.1:1/v1"}}


async def chat_with(
    catalog: ModelCatalog, settings: dict[str, Any], answer: httpx.Response, request: ChatRequest
) -> tuple[ChatResponse, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def handler(http_request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(http_request.content))
        return answer

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        llm = LLMClient(LLMSettings.model_validate(settings), catalog, http)
        return await llm.chat(request), sent


async def test_a_deep_call_in_the_history_goes_out_as_empty_arguments_on_either_wire(
    catalog: ModelCatalog,
) -> None:
    history = ChatRequest(
        messages=(
            Message(Role.USER, "what time is it?"),
            Message(Role.ASSISTANT, "", tool_calls=(ToolCall("c1", "time", '{"zone": ' + DEEP + "}"),)),
            Message(Role.TOOL, "Error: the arguments are nested too deeply", tool_call_id="c1", name="time"),
        )
    )
    anthropic_answer = {"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}
    reply, sent = await chat_with(catalog, ANTHROPIC, httpx.Response(200, json=anthropic_answer), history)
    assert reply.content == "ok"
    assert [b["input"] for m in sent[0]["messages"] for b in m["content"] if b["type"] == "tool_use"] == [{}]
    openai_answer = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
    reply, sent = await chat_with(catalog, OPENAI, httpx.Response(200, json=openai_answer), history)
    assert reply.content == "ok"
    calls = [c for m in sent[0]["messages"] for c in m.get("tool_calls", [])]
    assert [c["function"]["arguments"] for c in calls] == ["{}"]


@pytest.mark.parametrize("settings", [ANTHROPIC, OPENAI], ids=["anthropic", "openai"])
async def test_an_answer_nested_too_deeply_is_a_bad_response(
    catalog: ModelCatalog, settings: dict[str, Any]
) -> None:
    body = '{"content": [], "choices": [], "extra": ' + DEEP + "}"
    answer = httpx.Response(200, content=body.encode(), headers={"content-type": "application/json"})
    with pytest.raises(LLMBadResponse, match="malformed JSON"):
        await chat_with(catalog, settings, answer, ChatRequest(messages=(Message(Role.USER, "hi"),)))


async def test_a_streamed_event_nested_too_deeply_is_a_bad_response(catalog: ModelCatalog) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = f'data: {{"choices": [], "extra": {DEEP}}}\n\n'.encode()
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    with pytest.raises(LLMBadResponse, match="malformed JSON"):
        await stream_with(catalog, handler, max_retries=0)


async def test_an_error_body_nested_too_deeply_is_still_an_llm_error(catalog: ModelCatalog) -> None:
    answer = httpx.Response(400, content=DEEP.encode(), headers={"content-type": "application/json"})
    with pytest.raises(LLMError):
        await chat_with(catalog, OPENAI, answer, ChatRequest(messages=(Message(Role.USER, "hi"),)))


def test_deep_arguments_with_an_escaped_surrogate_are_kept_as_written() -> None:
    arguments = '{"name": "Zo\\ud83d", "list": ' + DEEP + "}"
    answer = ChatResponse("", (ToolCall("c1", "memory", arguments),))
    assert answer.tool_calls[0].arguments == arguments  # the tool loop tells the model it cannot read them


def test_a_consolidation_answer_nested_too_deeply_is_read_by_its_fields_or_not_at_all() -> None:
    assert parse_object('{"history_entry": "talked", "x": ' + DEEP + "}", ("history_entry",)) == (
        {"history_entry": "talked"},
        3,
    )
    assert parse_object(DEEP, ("history_entry",)) is None
