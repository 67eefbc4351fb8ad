"""Tool-call ids as a wire format accepts them: valid for it, and each used once in a request.

One chat's history goes out in both wire formats (``llm.fallback_models``, a model switch), and it
keeps the ids its models wrote. Anthropic accepts only ids matching ``^[a-zA-Z0-9_-]+$`` and refuses
one used twice ("`tool_use` ids must be unique"); OpenAI refuses one longer than 40 characters
("string too long. Expected a string with maximum length 40"). OpenAI-compatible servers write ids
such as ``functions.add:0`` (Kimi K2 on vLLM) or ``call_abc.1``, and sessions saved before call_ids.py
made each answer's ids unique can hold one id twice. Sent as written, every later request of such a
chat was refused with a 400, for good. So the translators pass the history through :func:`renamed`
with their format's :class:`IdRule`, before the tool pairs are checked (tool_pairs.py).

Only the request changes; the session keeps what the model wrote. Each new id depends on nothing but
the history up to its call, so a history always goes out the same, a longer one keeps the ids of its
beginning (prompt caches still match), and one whose ids are all fine goes out exactly as before.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from bot.domain import Message, Role, ToolCall


@dataclass(frozen=True, slots=True)
class IdRule:
    """What one wire format accepts as a tool-call id, and how the ids made in its place begin (the
    way its own models' ids do, so they read as ordinary ids)."""

    accepts: Callable[[str], object]
    prefix: str


def _openai_accepts(call_id: str) -> bool:
    return 0 < len(call_id) <= 40  # nothing is known about characters OpenAI refuses


ANTHROPIC_IDS = IdRule(re.compile(r"[a-zA-Z0-9_-]+").fullmatch, "toolu_")
OPENAI_IDS = IdRule(_openai_accepts, "call_")


def renamed(messages: Iterable[Message], rule: IdRule) -> list[Message]:
    """``messages`` in which every call whose id ``rule`` refuses, or an earlier call of the request
    already goes out with, gets a made id, and its result the same one.

    A result answers the first still unanswered call of its id in the assistant message right before
    it (only tool results in between), as tool_pairs.py pairs them; any other result keeps its id and
    becomes plain text there. Messages that need nothing are passed on as they are.
    """
    out: list[Message] = []
    taken: set[str] = set()  # the ids the request's calls go out with so far
    unanswered: dict[str, list[str]] = {}  # the latest calls still owed a result: id written -> ids sent
    for message in messages:
        if message.role is Role.TOOL:
            sent = unanswered.get(message.tool_call_id) if message.tool_call_id is not None else None
            if sent:
                new_id = sent.pop(0)
                if new_id != message.tool_call_id:
                    message = replace(message, tool_call_id=new_id)
            out.append(message)
            continue
        if unanswered:
            unanswered = {}
        if message.role is Role.ASSISTANT and message.tool_calls:
            calls = tuple(_sendable(call, rule, taken) for call in message.tool_calls)
            for written, call in zip(message.tool_calls, calls, strict=True):
                unanswered.setdefault(written.id, []).append(call.id)
            if calls != message.tool_calls:
                message = replace(message, tool_calls=calls)
        out.append(message)
    return out


def _sendable(call: ToolCall, rule: IdRule, taken: set[str]) -> ToolCall:
    call_id = call.id
    if call_id in taken or not rule.accepts(call_id):
        call_id = _made_id(call_id, rule.prefix, taken)
    taken.add(call_id)
    return call if call_id == call.id else ToolCall(call_id, call.name, call.arguments)


def _made_id(written: str, prefix: str, taken: set[str]) -> str:
    """``prefix`` and 24 hex digits of a hash of the written id: the same history gets the same ids.
    A second call with that id finds the first one's taken and hashes again with the next number."""
    attempt = 0
    while True:
        seed = f"{attempt}:{written}".encode("utf-8", "surrogatepass")
        candidate = prefix + hashlib.blake2b(seed, digest_size=12).hexdigest()
        if candidate not in taken:
            return candidate
        attempt += 1
