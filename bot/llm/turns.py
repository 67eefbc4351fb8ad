"""The conversation as every chat template accepts it: one system prompt, then alternating turns.

Strict templates (Llama, Mistral, Gemma and others, on Ollama, vLLM, llama.cpp or LM Studio) refuse a
request with a second system message or two user messages in a row ("Conversation roles must
alternate"), and a session gets both in ordinary use: ``/stop`` leaves a question without an answer
before the next one, and ``/compact`` puts its summary in a system message. Both translators send
:func:`normalized` messages, so every request has this shape:

- tool-call ids the wire format accepts, each used once (:func:`~bot.llm.wire_ids.renamed`);
- a name on every tool call that both APIs accept (``^[a-zA-Z0-9_-]{1,64}$``, as for the tools they
  are offered): one a model sent without any goes out as :data:`NAMELESS`, one with other characters
  (a local model's ``files<|channel|>commentary``) with those made ``_`` (a refused name made every
  later request of the chat fail);
- tool calls paired with their results (:func:`~bot.llm.tool_pairs.paired`), and otherwise untouched;
- system messages (compaction summaries) folded into the system prompt, in order;
- consecutive user messages merged into one, and so are consecutive assistant texts;
- empty assistant turns dropped, and a user turn first (a placeholder when the history starts with
  the assistant, as it can after compaction).
"""

from __future__ import annotations

import re
from dataclasses import replace

from bot.domain import Message, Role, ToolCall
from bot.llm.tool_pairs import paired
from bot.llm.types import ChatRequest
from bot.llm.wire_ids import IdRule, renamed

# Stands in where a template needs a user turn the history lacks (it must start with one).
OPENING = "(the conversation so far continues)"
# Stands in for the name of a tool call the model sent without one (its result said no such tool ran).
NAMELESS = "unnamed_tool"
_WIRE_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_NOT_IN_NAMES = re.compile(r"[^a-zA-Z0-9_-]+")


def normalized(request: ChatRequest, ids: IdRule) -> tuple[str, list[Message]]:
    """``(system prompt, messages)`` in the shape described in the module doc, with tool-call ids
    as ``ids`` (the wire format's rule) accepts them."""
    system = [request.system] if _says_something(request.system) else []
    out: list[Message] = []
    for message in paired(renamed(request.messages, ids)):
        if message.role is Role.SYSTEM:
            if _says_something(message.content):
                system.append(message.content)
            continue
        if message.role is Role.ASSISTANT and not message.tool_calls and not _says_something(message.content):
            continue  # says nothing; an empty assistant text is refused by some APIs
        if message.tool_calls and not all(_WIRE_NAME.fullmatch(call.name) for call in message.tool_calls):
            message = _named(message)
        last = out[-1] if out else None
        if last is not None and last.role is message.role and message.role is not Role.TOOL:
            out[-1] = _merged(last, message)
        else:
            out.append(message)
    if not out or out[0].role is not Role.USER:
        out.insert(0, Message(Role.USER, OPENING))
    return "\n\n".join(system), out


def _says_something(text: str) -> bool:
    return bool(text) and not text.isspace()  # as ``text.strip()``, without copying the text


def _named(message: Message) -> Message:
    calls = tuple(
        call if _WIRE_NAME.fullmatch(call.name) else ToolCall(call.id, _wire_name(call.name), call.arguments)
        for call in message.tool_calls
    )
    return replace(message, tool_calls=calls)


def _wire_name(name: str) -> str:
    return _NOT_IN_NAMES.sub("_", name).strip("_")[:64] or NAMELESS


def _merged(first: Message, second: Message) -> Message:
    """One turn from two of the same role; an earlier assistant turn never has tool calls here,
    because ``paired`` puts a call's results right after it."""
    text = "\n\n".join(part for part in (first.content, second.content) if _says_something(part))
    return Message(
        first.role,
        text,
        timestamp=first.timestamp,
        id=first.id,
        tool_calls=first.tool_calls + second.tool_calls,
        images=first.images + second.images,
        meta=first.meta,
    )
