"""Anthropic Messages wire format. Pure translation, no I/O (see openai.py for the shape)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from bot.catalog import ModelInfo
from bot.domain import Message, Role, ToolCall, Usage
from bot.errors import LLMBadResponse, LLMUnavailable
from bot.llm.sse import SSEvent
from bot.llm.types import ChatRequest, ChatResponse, StreamEvent

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"


def build_request(
    request: ChatRequest,
    *,
    model: ModelInfo,
    base_url: str | None,
    api_key: str | None,
    max_tokens: int,
    temperature: float | None,
    timeout: float,
    stream: bool = False,
) -> httpx.Request:
    system, messages = _messages(request)
    body: dict[str, Any] = {"model": model.id, "max_tokens": max_tokens, "messages": messages}
    if system:
        body["system"] = system
    if temperature is not None and model.supports_temperature:
        body["temperature"] = temperature
    if request.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in request.tools
        ]
    if stream:
        body["stream"] = True
    headers = {"content-type": "application/json", "anthropic-version": API_VERSION}
    if api_key:
        headers["x-api-key"] = api_key
    url = (base_url or DEFAULT_BASE_URL).rstrip("/") + "/v1/messages"
    return httpx.Request(
        "POST", url, json=body, headers=headers, extensions={"timeout": httpx.Timeout(timeout).as_dict()}
    )


def _messages(request: ChatRequest) -> tuple[str, list[dict[str, Any]]]:
    """System text goes top-level; turns must alternate user/assistant and start with the user.

    Consecutive messages of one role are merged, and tool results travel as ``tool_result`` blocks in a
    user message, as the Messages API requires.
    """
    system_parts = [request.system] if request.system else []
    out: list[dict[str, Any]] = []
    for message in request.messages:
        if message.role is Role.SYSTEM:
            system_parts.append(message.content)
            continue
        role = "assistant" if message.role is Role.ASSISTANT else "user"
        blocks = _blocks(message)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    if out and out[0]["role"] != "user":
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": "(earlier conversation)"}]})
    return "\n\n".join(p for p in system_parts if p), out


def _blocks(message: Message) -> list[dict[str, Any]]:
    if message.role is Role.TOOL:
        return [
            {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id or "",
                "content": message.content or "(empty)",
            }
        ]
    blocks: list[dict[str, Any]] = []
    if message.content.strip():
        blocks.append({"type": "text", "text": message.content})
    for image in message.images:
        blocks.append(
            {
                "type": "image",
                "source": {"type": "base64", "media_type": image.media_type, "data": image.data_b64},
            }
        )
    for call in message.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": _arguments(call.arguments)}
        )
    return blocks


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def parse_usage(data: dict[str, Any] | None) -> Usage:
    data = data or {}
    cached = int(data.get("cache_read_input_tokens") or 0)
    return Usage(
        input_tokens=int(data.get("input_tokens") or 0)
        + cached
        + int(data.get("cache_creation_input_tokens") or 0),
        output_tokens=int(data.get("output_tokens") or 0),
        cached_tokens=cached,
        calls=1,
    )


def parse_response(body: Any, model: str) -> ChatResponse:
    try:
        text: list[str] = []
        calls: list[ToolCall] = []
        for block in body["content"]:
            if block.get("type") == "text":
                text.append(str(block.get("text") or ""))
            elif block.get("type") == "tool_use":
                calls.append(
                    ToolCall(str(block["id"]), str(block["name"]), json.dumps(block.get("input") or {}))
                )
        return ChatResponse(
            "".join(text),
            tuple(calls),
            parse_usage(body.get("usage")),
            str(body.get("model") or model),
            str(body.get("stop_reason") or ""),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise LLMBadResponse(f"Anthropic sent an unexpected answer ({exc!r})", model=model) from None


class StreamDecoder:
    """Folds Anthropic's named stream events into text deltas and a final response."""

    def __init__(self, model: str) -> None:
        self._model = model
        self._text: list[str] = []
        self._blocks: dict[int, dict[str, str]] = {}
        self._usage = Usage(calls=1)
        self._stop = ""
        self.done = False

    def feed(self, event: SSEvent) -> list[StreamEvent]:
        if event.event == "ping":
            return []
        try:
            data = json.loads(event.data) if event.data else {}
        except json.JSONDecodeError:
            raise LLMBadResponse("Anthropic streamed malformed JSON", model=self._model) from None
        kind = event.event if event.event != "message" else str(data.get("type", ""))
        if kind == "error":
            error = data.get("error") or {}
            message = error.get("message", "stream error")
            if error.get("type") in ("overloaded_error", "api_error"):
                raise LLMUnavailable(f"Anthropic failed mid-answer: {message}", model=self._model)
            raise LLMBadResponse(f"Anthropic failed mid-answer: {message}", model=self._model)
        if kind == "message_start":
            self._usage = parse_usage((data.get("message") or {}).get("usage"))
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                self._blocks[int(data.get("index", 0))] = {
                    "id": block.get("id", ""),
                    "name": block.get("name", ""),
                    "json": "",
                }
        elif kind == "content_block_delta":
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                self._text.append(delta.get("text", ""))
                return [StreamEvent("text", text=delta.get("text", ""))]
            if delta.get("type") == "input_json_delta":
                slot = self._blocks.get(int(data.get("index", 0)))
                if slot is not None:
                    slot["json"] += delta.get("partial_json", "")
        elif kind == "message_delta":
            self._stop = str((data.get("delta") or {}).get("stop_reason") or self._stop)
            self._usage.output_tokens = int(
                (data.get("usage") or {}).get("output_tokens") or self._usage.output_tokens
            )
        elif kind == "message_stop":
            self.done = True
        return []

    def finish(self) -> ChatResponse:
        calls = tuple(
            ToolCall(b["id"], b["name"], b["json"] or "{}") for _, b in sorted(self._blocks.items())
        )
        return ChatResponse("".join(self._text), calls, self._usage, self._model, self._stop)
