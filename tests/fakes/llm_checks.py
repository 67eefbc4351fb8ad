"""Request validation for the fake LLM server: the rules the real APIs enforce with an HTTP 400.

Each check returns ``None`` for a request the real API would accept, else the error message it would
give. They are strict on purpose: a translator that builds a wrong shape must fail a test here, not in
production. ``check_openai(body, strict_template=True)`` adds what strict chat templates of local
servers demand (:func:`check_strict_template`).
"""

from __future__ import annotations

import json
import re
from typing import Any

# OpenAI reasoning models reject ``max_tokens`` and any temperature but the default.
_REASONING_PREFIXES = ("gpt-5", "o1", "o3", "o4")
# The tool-call ids each API takes: OpenAI's are at most 40 characters, Anthropic's match this pattern.
_OPENAI_MAX_ID = 40
_ANTHROPIC_ID = re.compile(r"[a-zA-Z0-9_-]+")


def check_openai(body: Any, *, strict_template: bool = False) -> str | None:
    if not isinstance(body, dict):
        return "We could not parse the JSON body of your request."
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "[] is too short - 'messages'"
    if "stream_options" in body and not body.get("stream"):
        return "The 'stream_options' parameter is only allowed when 'stream' is enabled."
    if body["model"].startswith(_REASONING_PREFIXES):
        if "max_tokens" in body:
            return "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."
        if body.get("temperature", 1) != 1:
            return "Unsupported value: 'temperature' does not support this value with this model. Only the default (1) value is supported."
    temperature = body.get("temperature")
    if temperature is not None and not (isinstance(temperature, int | float) and 0 <= temperature <= 2):
        return "temperature: must be a number between 0 and 2"
    for i, tool in enumerate(body.get("tools") or ()):
        function = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(function, dict) or not function.get("name"):
            return f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ...}}}}"
        if not isinstance(function.get("parameters", {}), dict):
            return f"tools[{i}].function.parameters must be an object"
    return _check_openai_messages(messages) or (check_strict_template(messages) if strict_template else None)


def check_strict_template(messages: list[Any]) -> str | None:
    """What strict chat templates (Llama, Mistral, Gemma ... served by Ollama, vLLM, llama.cpp or LM
    Studio) refuse: a system message anywhere but first, a first turn that is not the user's, or two
    user or two assistant messages in a row (tool results may follow each other). The servers also
    parse the arguments of every earlier tool call for the template and refuse the request when they
    are not a JSON object (vLLM's ``_postprocess_messages``, llama-server, SGLang, Ollama)."""
    for i, message in enumerate(messages):
        role = message.get("role")
        if role in ("system", "developer") and i > 0:
            return f"messages[{i}]: System message must be at the beginning."
        for call in message.get("tool_calls") or () if role == "assistant" else ():
            arguments = (call.get("function") or {}).get("arguments") or "{}"
            try:
                parsed = json.loads(arguments)
            except json.JSONDecodeError as exc:
                return f"{exc.msg}: line {exc.lineno} column {exc.colno} (char {exc.pos})"
            if not isinstance(parsed, dict):
                return f"messages[{i}]: tool call arguments must be a JSON object"
    turns = [m.get("role") for m in messages if m.get("role") not in ("system", "developer")]
    if turns and turns[0] != "user":
        return "Conversation roles must alternate user/assistant/user/assistant/... (starting with user)"
    for i in range(1, len(turns)):
        if turns[i] == turns[i - 1] and turns[i] != "tool":
            return "Conversation roles must alternate user/assistant/user/assistant/..."
    return None


def _check_openai_messages(messages: list[Any]) -> str | None:
    pending: set[str] = set()
    unanswered = (
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        "'tool_call_id'. The following tool_call_ids did not have response messages: "
    )
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "developer", "user", "assistant", "tool"):
            return f"messages[{i}].role: invalid value {role!r}"
        content = message.get("content")
        if role == "tool":
            if message.get("tool_call_id") not in pending:
                return (
                    f"messages[{i}]: messages with role 'tool' must be a response to a preceeding message "
                    "with 'tool_calls'."
                )
            pending.discard(message["tool_call_id"])
            if not isinstance(content, str):
                return f"messages[{i}].content: expected a string"
            continue
        if pending:
            return unanswered + ", ".join(sorted(pending))
        if role == "assistant":
            calls = message.get("tool_calls") or []
            if content is None and not calls:
                return f"messages[{i}].content: expected a string, got null."
            for k, call in enumerate(calls):
                function = call.get("function") or {}
                if call.get("type") != "function" or not call.get("id") or not function.get("name"):
                    return f"messages[{i}].tool_calls: each call needs id, type 'function' and a name"
                if len(call["id"]) > _OPENAI_MAX_ID:
                    return (
                        f"Invalid 'messages[{i}].tool_calls[{k}].id': string too long. Expected a string "
                        f"with maximum length {_OPENAI_MAX_ID}, but got a string with length "
                        f"{len(call['id'])} instead."
                    )
                if not isinstance(function.get("arguments"), str):
                    return f"messages[{i}].tool_calls[].function.arguments: expected a string"
                pending.add(call["id"])
        elif role == "user" and isinstance(content, list):
            for part in content:
                kind = part.get("type")
                if kind == "image_url":
                    url = (part.get("image_url") or {}).get("url", "")
                    if not url.startswith(("data:image/", "http://", "https://")):
                        return f"messages[{i}]: image_url.url must be a URL or a data: URL"
                elif kind != "text" or not isinstance(part.get("text"), str):
                    return f"messages[{i}].content: invalid content part {kind!r}"
        elif not isinstance(content, str):
            return f"messages[{i}].content: expected a string"
    if pending:
        return unanswered + ", ".join(sorted(pending))
    return None


def check_anthropic(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "Invalid JSON body"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: Field required"
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        return "max_tokens: Field required"
    temperature = body.get("temperature")
    if temperature is not None and not (isinstance(temperature, int | float) and 0 <= temperature <= 1):
        return "temperature: Input should be less than or equal to 1"
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        return "system: Input should be a valid string or list of text blocks"
    for i, tool in enumerate(body.get("tools") or ()):
        if not tool.get("name") or not isinstance(tool.get("input_schema"), dict):
            return f"tools.{i}: name and input_schema are required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    return _check_anthropic_messages(messages)


def _check_anthropic_messages(messages: list[Any]) -> str | None:
    if messages[0].get("role") != "user":
        return 'messages: first message must use the "user" role'
    open_uses: set[str] = set()
    all_uses: set[str] = set()  # tool_use ids are unique in the whole request, not per message
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            return f'messages.{i}.role: Input should be "user" or "assistant"'
        if i and messages[i - 1].get("role") == role:
            return 'messages: roles must alternate between "user" and "assistant"'
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            return f"messages.{i}: all messages must have non-empty content"
        problem = _check_blocks(i, role, blocks)
        if problem:
            return problem
        if role == "user":
            results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
            if set(results) - open_uses:
                return f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks"
            if open_uses - set(results):
                return (
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
                    f"after: {', '.join(sorted(open_uses - set(results)))}"
                )
            first_other = next((n for n, b in enumerate(blocks) if b.get("type") != "tool_result"), None)
            if first_other is not None and any(b.get("type") == "tool_result" for b in blocks[first_other:]):
                return f"messages.{i}: tool_result blocks must come first in the content"
            open_uses = set()
        else:
            uses = [(j, b["id"]) for j, b in enumerate(blocks) if b.get("type") == "tool_use"]
            for j, use in uses:
                if use in all_uses:
                    return f"messages.{i}.content.{j}: `tool_use` ids must be unique"
                all_uses.add(use)
            open_uses = {use for _, use in uses}
    if open_uses:
        return "messages: the final assistant message has `tool_use` blocks without results"
    return None


def _check_blocks(i: int, role: str, blocks: list[Any]) -> str | None:
    allowed = {"user": {"text", "image", "tool_result"}, "assistant": {"text", "tool_use"}}[role]
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        where = f"messages.{i}.content.{j}"
        if kind not in allowed:
            return f"{where}: block type {kind!r} is not allowed in a {role} message"
        if kind == "text" and not (isinstance(block.get("text"), str) and block["text"].strip()):
            return f"{where}: text content blocks must contain non-whitespace text"
        if kind == "image":
            source = block.get("source") or {}
            if source.get("type") != "base64" or not source.get("media_type") or not source.get("data"):
                return f"{where}.source: base64 source with media_type and data required"
        if kind == "tool_use":
            if not block.get("id") or not block.get("name"):
                return f"{where}: tool_use needs id and name"
            if not _ANTHROPIC_ID.fullmatch(str(block["id"])):
                return f"{where}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
            if not isinstance(block.get("input"), dict):
                return f"{where}.input: Input should be a valid dictionary"
        if kind == "tool_result" and not block.get("tool_use_id"):
            return f"{where}.tool_use_id: Field required"
    return None
