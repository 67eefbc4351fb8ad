"""Anthropic Messages wire format. Pure translation, no I/O (openai.py has the same three parts).

What differs from OpenAI: the system prompt is a top-level field; turns alternate user/assistant and
start with the user; tool results travel as ``tool_result`` blocks at the front of the next user
message; ``tool_use.input`` is an object, not a JSON string; ``max_tokens`` is required; temperature
stops at 1.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import structlog

from bot.domain import Message, Role, ToolCall, Usage
from bot.errors import LLMBadResponse
from bot.llm.counts import token_count, usage_object
from bot.llm.failures import stream_error
from bot.llm.sse import SSEvent, StreamFold
from bot.llm.turns import OPENING, normalized
from bot.llm.types import ChatRequest, ChatResponse, StreamEvent, Wire
from bot.llm.wire_ids import ANTHROPIC_IDS

log = structlog.get_logger(__name__)

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"


def build_request(request: ChatRequest, wire: Wire) -> httpx.Request:
    """The POST to ``<base_url>/v1/messages`` with ``x-api-key`` and ``anthropic-version``."""
    system, turns = messages(request)
    body: dict[str, Any] = {"model": wire.model.id, "max_tokens": wire.max_tokens, "messages": turns}
    if system:
        body["system"] = system
    if wire.temperature is not None and wire.model.supports_temperature:
        body["temperature"] = min(max(wire.temperature, 0.0), 1.0)
    if request.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in request.tools
        ]
    if wire.stream:
        body["stream"] = True
    headers = {
        "content-type": "application/json",
        "accept": "application/json",
        "anthropic-version": API_VERSION,
    }
    if wire.api_key:
        headers["x-api-key"] = wire.api_key
    url = (wire.base_url or DEFAULT_BASE_URL).rstrip("/") + "/v1/messages"
    timeout = {"timeout": wire.timeout.as_dict()}
    return httpx.Request("POST", url, json=body, headers=headers, extensions=timeout)


def messages(request: ChatRequest) -> tuple[str, list[dict[str, Any]]]:
    """``(system, messages)``: system text top-level; alternating turns that start with the user.

    The history comes normalized (bot/llm/turns.py). Tool results travel in user turns here, so
    they are merged with the user text after them: the results of one assistant message's tool calls
    land together in a single user turn, before any text.
    """
    system, history = normalized(request, ANTHROPIC_IDS)
    turns: list[dict[str, Any]] = []
    for message in history:
        role = "assistant" if message.role is Role.ASSISTANT else "user"
        blocks = _blocks(message)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    if not turns or turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": [{"type": "text", "text": OPENING}]})
    return system, turns


def _blocks(message: Message) -> list[dict[str, Any]]:
    if message.role is Role.TOOL:
        result = {
            "type": "tool_result",
            "tool_use_id": message.tool_call_id or "",
            "content": message.content,
        }
        if not message.content.strip():
            result["content"] = "(empty)"  # whitespace-only text is rejected
        return [result]
    # Runs for every message of every request: the common text-only message takes the short way.
    text = [{"type": "text", "text": message.content}] if message.content.strip() else []
    if not (message.images or message.tool_calls):
        return text
    images: list[dict[str, Any]] = [
        {
            "type": "image",
            "source": {"type": "base64", "media_type": image.media_type, "data": image.data_b64},
        }
        for image in message.images  # images before text, as Anthropic recommends
    ]
    calls = [
        {"type": "tool_use", "id": call.id, "name": call.name, "input": _arguments(call.arguments)}
        for call in message.tool_calls
    ]
    return images + text + calls


def _arguments(text: str) -> dict[str, Any]:
    """``tool_use.input`` must be an object; arguments that are not a JSON object (or are nested too
    deeply to decode) become ``{}``."""
    try:
        value = json.loads(text or "{}")
    except (json.JSONDecodeError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def parse_usage(data: Any, model: str, where: str) -> Usage:
    """Anthropic counts cache reads and writes apart from ``input_tokens``; ours includes them. A count
    that is no count is 0 and logged, never a failed answer (counts.py)."""
    usage = usage_object(data, "usage", model=model, where=where)
    cached = token_count(usage, "cache_read_input_tokens", model=model, where=where)
    written = token_count(usage, "cache_creation_input_tokens", model=model, where=where)
    return Usage(
        input_tokens=token_count(usage, "input_tokens", model=model, where=where) + cached + written,
        output_tokens=token_count(usage, "output_tokens", model=model, where=where),
        cached_tokens=cached,
        calls=1,
    )


def parse_response(body: Any, model: str, where: str = "Anthropic") -> ChatResponse:
    """A ChatResponse from a decoded ``message`` body; anything else is LLMBadResponse."""
    try:
        text: list[str] = []
        calls: list[ToolCall] = []
        for block in body["content"]:
            if block.get("type") == "text":
                text.append(str(block.get("text") or ""))
            elif block.get("type") == "tool_use":
                # A compatible server may send no id: the client names it (call_ids.py).
                call_id, input_ = str(block.get("id") or ""), block.get("input") or {}
                calls.append(ToolCall(call_id, str(block["name"]), json.dumps(input_)))
        return ChatResponse(
            "".join(text),
            tuple(calls),
            parse_usage(body.get("usage"), model, where),
            str(body.get("model") or model),
            str(body.get("stop_reason") or ""),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise LLMBadResponse(
            f"{where} sent an answer without the expected fields ({exc!r})", model=model
        ) from None


class StreamDecoder(StreamFold):
    """Folds Anthropic's named stream events into text deltas and, at the end, one ChatResponse.

    ``message_start`` brings input usage, ``content_block_*`` the text and tool-use blocks (tool input
    as ``input_json_delta`` fragments), ``message_delta`` the stop reason and output usage, and
    ``message_stop`` the end (``done``). An ``error`` event can arrive mid-stream with HTTP 200; it is
    raised as the error the same failure would be as a response (``overloaded_error`` →
    LLMUnavailable, and so on).

    A stream that ends after a ``message_delta`` with a ``stop_reason``, every content block closed,
    but before ``message_stop`` (a proxy or a connection that closed one event early) holds the whole
    answer: it is ``complete``, taken and logged, not asked for again and paid twice. Without a stop
    reason, or with a block still open, the answer may be cut anywhere: incomplete.
    """

    def __init__(self, model: str, where: str = "Anthropic") -> None:
        super().__init__(model, where)
        self._input_at_start: set[int] = set()  # tool calls whose input came whole in content_block_start
        self._open: set[int] = set()  # content blocks started and not yet stopped
        self._stopped = False  # a message_delta said why the message ended

    @property
    def complete(self) -> bool:
        return self.done or (self._stopped and not self._open)

    def finish(self) -> ChatResponse:
        if not self.done:
            log.warning(
                "llm_stream_without_message_stop",
                model=self._model,
                server=self._where,
                stop_reason=self._stop,
            )
        return super().finish()

    def feed(self, event: SSEvent) -> list[StreamEvent]:
        if event.event == "ping":
            return []
        data = self._object(event.data, "event")
        kind = event.event if event.event != "message" else str(data.get("type", ""))
        if kind == "error":
            error = data.get("error") or {}
            if not isinstance(error, dict):  # some compatible servers send the message alone
                error = {"message": str(error)}
            raise stream_error(
                str(error.get("type") or ""),
                str(error.get("message") or "stream error"),
                model=self._model,
                provider="anthropic",
                where=self._where,
            )
        if kind == "message_start":
            message = data.get("message") or {}
            self._usage = parse_usage(message.get("usage"), self._model, self._where)
            self._served_by = str(message.get("model") or "")
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            index = int(data.get("index", 0))
            self._open.add(index)
            if block.get("type") == "tool_use":
                call = self._call(index)
                call.id, call.name = str(block.get("id") or ""), str(block.get("name") or "")
                if isinstance(block.get("input"), dict) and block["input"]:
                    # Some compatible servers send the whole input here and no input_json_delta.
                    self._argued(call, json.dumps(block["input"]), restart=True)
                    self._input_at_start.add(index)
                return [StreamEvent("tool_call", text=call.name)]
        elif kind == "content_block_delta":
            return self._delta(int(data.get("index", 0)), data.get("delta") or {})
        elif kind == "content_block_stop":
            self._open.discard(int(data.get("index", 0)))
        elif kind == "message_delta":
            stop_reason = (data.get("delta") or {}).get("stop_reason")
            self._stopped = self._stopped or bool(stop_reason)
            self._stop = str(stop_reason or self._stop)
            usage = usage_object(data.get("usage"), "usage", model=self._model, where=self._where)
            if usage.get("output_tokens") is not None:
                self._usage.output_tokens = self._count(usage, "output_tokens")
            if usage.get("input_tokens") and not self._usage.input_tokens:  # servers that count it late
                self._usage.input_tokens = self._count(usage, "input_tokens")
        elif kind == "message_stop":
            self.done = True
        return []

    def _count(self, usage: dict[str, Any], field: str) -> int:
        return token_count(usage, field, model=self._model, where=self._where)

    def _delta(self, index: int, delta: dict[str, Any]) -> list[StreamEvent]:
        if delta.get("type") == "text_delta" and delta.get("text"):
            return self._said(str(delta["text"]))
        if delta.get("type") == "input_json_delta" and index in self._calls:
            restart = index in self._input_at_start  # the deltas say it all again
            self._input_at_start.discard(index)
            self._argued(self._calls[index], str(delta.get("partial_json", "")), restart=restart)
        return []
