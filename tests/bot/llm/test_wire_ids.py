"""Tool-call ids go out valid for the wire format and once per request, each result with its own call.

Histories written by other models (``functions.add:0`` from Kimi on vLLM, long ids) or saved before
ids were made unique, sent end to end to the fake server, which refuses what the real APIs refuse.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from bot.catalog import ModelCatalog
from bot.domain import Message, Role, ToolCall
from bot.llm import ChatRequest, ToolSpec, anthropic, openai
from bot.llm.types import Wire
from bot.llm.wire_ids import ANTHROPIC_IDS, OPENAI_IDS, renamed
from tests.fakes.llm_server import FakeLLMServer, FakeReply

both = pytest.mark.parametrize("api", ["openai", "anthropic"])
ADD = ToolSpec("add", "Add", {"type": "object", "properties": {"n": {"type": "integer"}}})
LONG = "call_" + "x" * 59  # 64 characters, as some gateways write them


def calls(*ids: str, first: int) -> Message:
    """An assistant message calling ``add`` once per id; call ``k`` carries ``{"n": k}``."""
    made = tuple(ToolCall(call_id, "add", json.dumps({"n": first + k})) for k, call_id in enumerate(ids))
    return Message(Role.ASSISTANT, "", tool_calls=made)


def result(call_id: str, n: int) -> Message:
    return Message(Role.TOOL, f"result {n}", tool_call_id=call_id, name="add")


def sent(api: str, body: dict[str, Any]) -> tuple[list[str], list[tuple[int, str]]]:
    """The call ids of a request in order, and each result as ``(n of the call it answers, text)``."""
    arguments: dict[str, int] = {}
    ids: list[str] = []
    answered: list[tuple[str, str]] = []
    for message in body["messages"]:
        if api == "openai":
            for call in message.get("tool_calls") or ():
                ids.append(call["id"])
                arguments[call["id"]] = json.loads(call["function"]["arguments"])["n"]
            if message["role"] == "tool":
                answered.append((message["tool_call_id"], message["content"]))
        elif isinstance(message["content"], list):
            for block in message["content"]:
                if block["type"] == "tool_use":
                    ids.append(block["id"])
                    arguments[block["id"]] = block["input"]["n"]
                elif block["type"] == "tool_result":
                    answered.append((block["tool_use_id"], block["content"]))
    return ids, [(arguments[call_id], text) for call_id, text in answered]


def request_of(*history: Message) -> ChatRequest:
    return ChatRequest(messages=(Message(Role.USER, "go"), *history), system="be brief", tools=(ADD,))


FOREIGN = (
    calls("functions.add:0", "functions.add:1", first=1),
    result("functions.add:0", 1),
    result("functions.add:1", 2),
    Message(Role.ASSISTANT, "1 and 2."),
    Message(Role.USER, "more"),
    calls("call_abc.1", LONG, first=3),
    result(LONG, 4),  # results may come in any order
    result("call_abc.1", 3),
    Message(Role.USER, "thanks"),
)


@both
async def test_ids_the_format_refuses_are_replaced_and_each_result_keeps_its_call(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    """A history written by an OpenAI-compatible server (Kimi's ``functions.add:0``, ``call_abc.1``,
    a 64-character id), sent after a failover or a model switch: Anthropic refused every request of
    the chat (``tool_use.id: String should match pattern``), OpenAI the long id."""
    llm, _ = make_client(api)
    server.script(FakeReply(text="you're welcome"))
    response = await llm.chat(request_of(*FOREIGN))

    assert response.content == "you're welcome"
    ids, results = sent(api, server.requests[-1].body)
    assert results == [(1, "result 1"), (2, "result 2"), (4, "result 4"), (3, "result 3")]
    assert len(set(ids)) == 4
    if api == "openai":  # only the long one is refused there
        assert ids[:3] == ["functions.add:0", "functions.add:1", "call_abc.1"] and ids[3] != LONG
    else:  # Anthropic takes any length
        assert all(i.startswith("toolu_") and len(i) == 30 for i in ids[:3]) and ids[3] == LONG
    assert FOREIGN[0].tool_calls[0].id == "functions.add:0"  # the session keeps what the model wrote


REPEATED = (
    calls("call_0", first=1),
    result("call_0", 1),
    Message(Role.ASSISTANT, "1."),
    Message(Role.USER, "again"),
    calls("call_0", first=2),
    result("call_0", 2),
    Message(Role.USER, "two at once"),
    calls("call_0", "call_0", first=3),
    result("call_0", 3),
    result("call_0", 4),
    Message(Role.USER, "and?"),
)


@both
async def test_a_repeated_id_goes_out_once_and_each_result_answers_its_own_call(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    """A session saved before answers' ids were made unique: ``call_0`` in two answers and twice in a
    third. Anthropic refused it ("`tool_use` ids must be unique"); on OpenAI the second result of the
    double call went out as plain user text, and the call looked answered by the first."""
    llm, _ = make_client(api)
    server.script(FakeReply(text="done"))
    assert (await llm.chat(request_of(*REPEATED))).content == "done"

    ids, results = sent(api, server.requests[-1].body)
    assert ids[0] == "call_0" and len(set(ids)) == 4  # the first keeps its id
    assert results == [(n, f"result {n}") for n in (1, 2, 3, 4)]


def build(module: Any, catalog: ModelCatalog, model: str, request: ChatRequest) -> bytes:
    wire = Wire(catalog.get(model), None, "k", 50, None, httpx.Timeout(5.0))
    built: httpx.Request = module.build_request(request, wire)
    return built.content


@pytest.mark.parametrize(
    ("module", "model", "rule"),
    [(openai, "gpt-4.1-mini", OPENAI_IDS), (anthropic, "claude-haiku-4-5", ANTHROPIC_IDS)],
)
def test_the_made_ids_are_the_same_every_time_and_sound_ids_are_left_alone(
    catalog: ModelCatalog, module: Any, model: str, rule: Any
) -> None:
    """Prompt caching matches a request's beginning byte for byte: the same history must give the
    same ids, and a longer one must keep the ids its beginning got."""
    history = (*FOREIGN, *REPEATED)
    first = build(module, catalog, model, request_of(*history))
    assert first == build(module, catalog, model, request_of(*history))
    refused = b"call_abc.1" if module is anthropic else LONG.encode()
    assert refused not in first

    shorter = renamed(history[:9], rule)
    longer = renamed([*history, calls("call_0", first=5), result("call_0", 5)], rule)
    assert longer[:9] == shorter
    assert longer[-2].tool_calls[0].id == longer[-1].tool_call_id != "call_0"

    sound = (
        calls("toolu_01A09q90qw90lq917835lq9", "call_Kx2bS9dQ3m", first=1),
        result("call_Kx2bS9dQ3m", 2),
        result("toolu_01A09q90qw90lq917835lq9", 1),
    )
    assert all(out is message for out, message in zip(renamed(sound, rule), sound, strict=True))
