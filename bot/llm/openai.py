"""OpenAI chat-completions wire format (OpenAI, OpenRouter, Ollama, vLLM, llama.cpp, LM Studio).

Pure translation, no I/O: ``build_request`` turns a ChatRequest into an httpx.Request, ``parse_response``
turns a JSON body into a ChatResponse, and ``StreamDecoder`` folds SSE chunks into events.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from bot.catalog import ModelInfo
from bot.domain import Message, Role, ToolCall, Usage
from bot.errors import LLMBadResponse
from bot.llm.sse import SSEvent
from bot.llm.types import ChatRequest, ChatResponse, StreamEvent

DEFAULT_BASE_URL = "https://api.openai.com/v1"


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
    body: dict[str, Any] = {"model": model.id, "messages": _messages(request)}
    official = base_url is None or "api.openai.com" in base_url
    # Official OpenAI (gpt-5, o-series) needs max_completion_tokens; local servers know max_tokens.
    body["max_completion_tokens" if official else "max_tokens"] = max_tokens
    if temperature is not None and model.supports_temperature:
        body["temperature"] = temperature
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
            }
            for t in request.tools
        ]
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    url = (base_url or DEFAULT_BASE_URL).rstrip("/") + "/chat/completions"
    return httpx.Request(
        "POST", url, json=body, headers=headers, extensions={"timeout": httpx.Timeout(timeout).as_dict()}
    )


def _messages(request: ChatRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    for message in request.messages:
        out.append(_message(message))
    return out


def _message(message: Message) -> dict[str, Any]:
    if message.role is Role.TOOL:
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content}
    if message.role is Role.ASSISTANT:
        data: dict[str, Any] = {"role": "assistant", "content": message.content or None}
        if message.tool_calls:
            data["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments or "{}"},
                }
                for c in message.tool_calls
            ]
        return data
    if message.role is Role.USER and message.images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": message.content}]
        parts += [
            {"type": "image_url", "image_url": {"url": f"data:{img.media_type};base64,{img.data_b64}"}}
            for img in message.images
        ]
        return {"role": "user", "content": parts}
    return {"role": message.role.value, "content": message.content}


def parse_usage(data: dict[str, Any] | None) -> Usage:
    if not data:
        return Usage(calls=1)
    details = data.get("prompt_tokens_details") or {}
    return Usage(
        input_tokens=int(data.get("prompt_tokens") or 0),
        output_tokens=int(data.get("completion_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
        calls=1,
    )


def parse_response(body: Any, model: str) -> ChatResponse:
    try:
        choice = body["choices"][0]
        message = choice["message"]
        calls = tuple(
            ToolCall(
                id=str(c["id"]),
                name=str(c["function"]["name"]),
                arguments=str(c["function"].get("arguments") or ""),
            )
            for c in message.get("tool_calls") or ()
        )
        return ChatResponse(
            content=str(message.get("content") or ""),
            tool_calls=calls,
            usage=parse_usage(body.get("usage")),
            model=str(body.get("model") or model),
            stop_reason=str(choice.get("finish_reason") or ""),
        )
    except (KeyError, IndexError, TypeError) as exc:
        raise LLMBadResponse(f"the model server sent an unexpected answer ({exc!r})", model=model) from None


class StreamDecoder:
    """Accumulates streamed chunks; tool-call fragments are joined by their ``index``."""

    def __init__(self, model: str) -> None:
        self._model = model
        self._text: list[str] = []
        self._calls: dict[int, dict[str, str]] = {}
        self._usage = Usage(calls=1)
        self._stop = ""
        self.done = False

    def feed(self, event: SSEvent) -> list[StreamEvent]:
        if event.data.strip() == "[DONE]":
            self.done = True
            return []
        try:
            chunk = json.loads(event.data)
        except json.JSONDecodeError:
            raise LLMBadResponse("the model server streamed malformed JSON", model=self._model) from None
        if not isinstance(chunk, dict):
            raise LLMBadResponse("the model server streamed an unexpected chunk", model=self._model)
        if "error" in chunk:
            message = (
                (chunk["error"] or {}).get("message", "stream error")
                if isinstance(chunk["error"], dict)
                else chunk["error"]
            )
            raise LLMBadResponse(f"the model server failed mid-answer: {message}", model=self._model)
        if chunk.get("usage"):
            self._usage = parse_usage(chunk["usage"])
        out: list[StreamEvent] = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self._text.append(delta["content"])
                out.append(StreamEvent("text", text=delta["content"]))
            for fragment in delta.get("tool_calls") or ():
                slot = self._calls.setdefault(
                    int(fragment.get("index", 0)), {"id": "", "name": "", "arguments": ""}
                )
                if fragment.get("id"):
                    slot["id"] = fragment["id"]
                function = fragment.get("function") or {}
                if function.get("name"):
                    slot["name"] += function["name"]
                if function.get("arguments"):
                    slot["arguments"] += function["arguments"]
            if choice.get("finish_reason"):
                self._stop = choice["finish_reason"]
        return out

    def finish(self) -> ChatResponse:
        calls = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for _, c in sorted(self._calls.items()))
        return ChatResponse("".join(self._text), calls, self._usage, self._model, self._stop)
