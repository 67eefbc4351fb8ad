"""Tool-call ids: each call of an answer gets an id no other call of the conversation has.

The result of a call is matched to it by that id alone, in the next request and in the session. Some
OpenAI-compatible local servers (llama-server, Ollama, some vLLM versions) send the same id for two
calls of one answer, start again at ``call_0`` in every answer, or send none. Kept as sent, the first
result was taken as the answer to both calls and the second went out as plain user text
(tool_pairs.py); Anthropic refuses a request in which an id appears twice ("`tool_use` ids must be
unique"), and Anthropic's answers with no id were refused as malformed. The client therefore passes
every answer through :func:`made_unique` with the request it answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import structlog

from bot.domain import Message, Role, ToolCall
from bot.llm.types import ChatRequest, ChatResponse

log = structlog.get_logger(__name__)


def made_unique(response: ChatResponse, request: ChatRequest, prefix: str, model: str) -> ChatResponse:
    """``response`` with :func:`unique_calls` applied against ``request``'s history; what was replaced
    is logged (``tool_call_ids_replaced``), as it says which server sends such ids."""
    if not response.tool_calls:
        return response
    calls = unique_calls(response.tool_calls, used_ids(request.messages), prefix)
    if calls != response.tool_calls:
        replaced = [old.id for old, new in zip(response.tool_calls, calls, strict=True) if old.id != new.id]
        log.warning("tool_call_ids_replaced", model=model, replaced=replaced, calls=len(calls))
        response.tool_calls = calls
    return response


def used_ids(messages: Iterable[Message]) -> set[str]:
    """The call ids a history already holds: its calls' and the ids its results answer."""
    ids: set[str] = set()
    for message in messages:
        if message.role is Role.ASSISTANT:
            ids.update(call.id for call in message.tool_calls)
        elif message.role is Role.TOOL and message.tool_call_id:
            ids.add(message.tool_call_id)
    return ids


def unique_calls(calls: tuple[ToolCall, ...], used: set[str], prefix: str) -> tuple[ToolCall, ...]:
    """``calls`` with a fresh id (``prefix`` and 24 random hex digits) for each one whose id is empty,
    already in ``used``, or taken by an earlier call of the same answer; the first keeps its own."""
    taken = set(used)
    out: list[ToolCall] = []
    for call in calls:
        call_id = call.id
        if not call_id.strip() or call_id in taken:
            call_id = fresh_id(prefix, taken)
        taken.add(call_id)
        out.append(call if call_id == call.id else ToolCall(call_id, call.name, call.arguments))
    return tuple(out)


def fresh_id(prefix: str, taken: set[str]) -> str:
    while True:  # a collision of 96 random bits does not happen; the loop says it cannot
        candidate = prefix + uuid.uuid4().hex[:24]
        if candidate not in taken:
            return candidate
