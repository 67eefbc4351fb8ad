"""A local model server speaking the OpenAI chat-completions and Anthropic Messages wire formats.

It validates requests the way the real APIs do (so a wrong translator fails a test), answers from a
script of :class:`FakeReply` values or a ``responder`` function, and otherwise echoes the last user text.
Streaming, tool calls, error statuses with headers, slow answers, malformed bodies and mid-stream
failures are all scriptable.

    async with FakeLLMServer() as llm:
        llm.script(FakeReply(status=429, headers={"retry-after": "2"}), FakeReply(text="hi"))
        settings.llm.openai.base_url = llm.openai_base_url
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class FakeReply:
    text: str = ""
    tool_calls: list[tuple[str, str | dict[str, Any]]] = field(default_factory=list)
    status: int = 200
    error: dict[str, Any] | str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    malformed: bool = False
    stream_error_after: int | None = None  # streamed text chunks before a mid-stream failure
    usage: tuple[int, int] | None = None  # (input, output) tokens; default: estimated


@dataclass
class RecordedRequest:
    api: str  # "openai" | "anthropic"
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


Responder = Callable[[str, dict[str, Any]], FakeReply | None]


class FakeLLMServer:
    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.responder: Responder | None = None
        self._script: deque[FakeReply] = deque()
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.in_flight = 0

    # -- lifecycle --------------------------------------------------------------------------------

    async def __aenter__(self) -> FakeLLMServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/v1/messages", self._anthropic)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def openai_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def script(self, *replies: FakeReply) -> None:
        self._script.extend(replies)

    # -- handlers ---------------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "gpt-4.1-mini", "object": "model"}]})

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(RecordedRequest("openai", request.path, body, dict(request.headers)))
        problem = _check_openai(body)
        if problem:
            return _json_error(400, {"error": {"message": problem, "type": "invalid_request_error"}})
        reply = self._next("openai", body)
        return await self._answer("openai", request, body, reply)

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(RecordedRequest("anthropic", request.path, body, dict(request.headers)))
        if not request.headers.get("x-api-key") or request.headers.get("anthropic-version") != "2023-06-01":
            return _json_error(
                401,
                {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}},
            )
        problem = _check_anthropic(body)
        if problem:
            return _json_error(
                400, {"type": "error", "error": {"type": "invalid_request_error", "message": problem}}
            )
        reply = self._next("anthropic", body)
        return await self._answer("anthropic", request, body, reply)

    def _next(self, api: str, body: dict[str, Any]) -> FakeReply:
        if self._script:
            return self._script.popleft()
        if self.responder is not None:
            reply = self.responder(api, body)
            if reply is not None:
                return reply
        return FakeReply(text=f"echo: {_last_user_text(api, body)}")

    async def _answer(
        self, api: str, request: web.Request, body: dict[str, Any], reply: FakeReply
    ) -> web.StreamResponse:
        self.in_flight += 1
        try:
            if reply.delay:
                await asyncio.sleep(reply.delay)
            if reply.status >= 400:
                error = reply.error if reply.error is not None else _default_error(api, reply.status)
                text = error if isinstance(error, str) else json.dumps(error)
                return web.Response(
                    status=reply.status,
                    text=text,
                    headers={"content-type": "application/json", **reply.headers},
                )
            if reply.malformed:
                return web.Response(text='{"choices": [', content_type="application/json")
            usage = reply.usage or (max(1, len(json.dumps(body)) // 4), max(1, len(reply.text) // 4 + 1))
            if body.get("stream"):
                return await _stream(api, request, body, reply, usage)
            payload = (
                _openai_body(body, reply, usage) if api == "openai" else _anthropic_body(body, reply, usage)
            )
            return web.json_response(payload, headers=reply.headers)
        finally:
            self.in_flight -= 1


# ---- validation like the real APIs ----------------------------------------------------------------


def _check_openai(body: dict[str, Any]) -> str | None:
    if not body.get("model") or not isinstance(body.get("messages"), list) or not body["messages"]:
        return "model and a non-empty messages list are required"
    pending: set[str] = set()
    for message in body["messages"]:
        role = message.get("role")
        if role not in ("system", "user", "assistant", "tool", "developer"):
            return f"invalid role {role!r}"
        if role == "tool":
            if message.get("tool_call_id") not in pending:
                return (
                    "messages with role 'tool' must be a response to a preceeding message with 'tool_calls'"
                )
            pending.discard(message["tool_call_id"])
            continue
        if pending:
            return "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'"
        if role == "assistant":
            for call in message.get("tool_calls") or ():
                if not isinstance(call.get("function", {}).get("arguments"), str):
                    return "tool_calls[].function.arguments must be a string"
                pending.add(call["id"])
    if pending:
        return "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'"
    return None


def _check_anthropic(body: dict[str, Any]) -> str | None:
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens: Field required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    if messages[0].get("role") != "user":
        return 'messages: first message must use the "user" role'
    previous_tool_uses: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role")
        if i and messages[i - 1].get("role") == role:
            return 'messages: roles must alternate between "user" and "assistant"'
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            return f"messages.{i}: content must be non-empty"
        if role == "user":
            results = {b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"}
            if results - previous_tool_uses:
                return f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks"
            if previous_tool_uses - results:
                return (
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after"
                )
            previous_tool_uses = set()
        else:
            previous_tool_uses = {b["id"] for b in blocks if b.get("type") == "tool_use"}
            for b in blocks:
                if b.get("type") == "tool_use" and not isinstance(b.get("input"), dict):
                    return f"messages.{i}: tool_use.input must be an object"
        for b in blocks:
            if b.get("type") == "text" and not b.get("text", "").strip():
                return f"messages.{i}: text content blocks must be non-empty"
    if previous_tool_uses:
        return "the last assistant message has tool_use blocks without results"
    return None


def _last_user_text(api: str, body: dict[str, Any]) -> str:
    for message in reversed(body["messages"]):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        texts = [b.get("text", "") for b in content if b.get("type") == "text"]
        if texts:
            return texts[-1]
        return "done"
    return ""


def _default_error(api: str, status: int) -> dict[str, Any]:
    kinds = {401: "authentication_error", 429: "rate_limit_error", 529: "overloaded_error", 500: "api_error"}
    kind = kinds.get(status, "api_error")
    if api == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": kind.replace("_", " ")}}
    return {"error": {"message": kind.replace("_", " "), "type": kind, "code": None}}


def _json_error(status: int, payload: dict[str, Any]) -> web.Response:
    return web.json_response(payload, status=status)


def _args_text(args: str | dict[str, Any]) -> str:
    return args if isinstance(args, str) else json.dumps(args)


def _call_id(api: str) -> str:
    return ("toolu_" if api == "anthropic" else "call_") + uuid.uuid4().hex[:12]


def _openai_body(body: dict[str, Any], reply: FakeReply, usage: tuple[int, int]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": _call_id("openai"),
                "type": "function",
                "function": {"name": n, "arguments": _args_text(a)},
            }
            for n, a in reply.tool_calls
        ]
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex[:8],
        "object": "chat.completion",
        "model": body["model"],
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if reply.tool_calls else "stop"}
        ],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


def _anthropic_body(body: dict[str, Any], reply: FakeReply, usage: tuple[int, int]) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    for name, args in reply.tool_calls:
        parsed = json.loads(args) if isinstance(args, str) else args
        content.append({"type": "tool_use", "id": _call_id("anthropic"), "name": name, "input": parsed})
    return {
        "id": "msg_" + uuid.uuid4().hex[:8],
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def _pieces(text: str) -> list[str]:
    if not text:
        return []
    size = max(1, len(text) // 3)
    return [text[i : i + size] for i in range(0, len(text), size)]


async def _stream(
    api: str, request: web.Request, body: dict[str, Any], reply: FakeReply, usage: tuple[int, int]
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
    await response.prepare(request)

    async def send(data: dict[str, Any] | str, event: str | None = None) -> None:
        text = data if isinstance(data, str) else json.dumps(data)
        prefix = f"event: {event}\n" if event else ""
        await response.write(f"{prefix}data: {text}\n\n".encode())
        await asyncio.sleep(0)

    pieces = _pieces(reply.text)
    if api == "openai":
        base = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "model": body["model"]}
        for i, piece in enumerate(pieces):
            if reply.stream_error_after is not None and i >= reply.stream_error_after:
                request.transport.close()  # type: ignore[union-attr]  # the connection drops mid-answer
                return response
            await send(
                {**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            )
        for index, (name, args) in enumerate(reply.tool_calls):
            text = _args_text(args)
            first = {
                "index": index,
                "id": _call_id("openai"),
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            await send(
                {**base, "choices": [{"index": 0, "delta": {"tool_calls": [first]}, "finish_reason": None}]}
            )
            for part in _pieces(text):
                delta = {"tool_calls": [{"index": index, "function": {"arguments": part}}]}
                await send({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        finish = "tool_calls" if reply.tool_calls else "stop"
        await send({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            await send(
                {**base, "choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}}
            )
        await send("[DONE]")
    else:
        start = {
            "type": "message_start",
            "message": {
                "id": "msg_s",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": [],
                "usage": {"input_tokens": usage[0], "output_tokens": 1},
            },
        }
        await send(start, "message_start")
        await send({"type": "ping"}, "ping")
        index = 0
        if pieces:
            await send(
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                "content_block_start",
            )
            for i, piece in enumerate(pieces):
                if reply.stream_error_after is not None and i >= reply.stream_error_after:
                    await send(
                        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
                        "error",
                    )
                    return response
                await send(
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": piece},
                    },
                    "content_block_delta",
                )
            await send({"type": "content_block_stop", "index": 0}, "content_block_stop")
            index = 1
        for name, args in reply.tool_calls:
            block = {"type": "tool_use", "id": _call_id("anthropic"), "name": name, "input": {}}
            await send(
                {"type": "content_block_start", "index": index, "content_block": block}, "content_block_start"
            )
            for part in _pieces(_args_text(args)):
                delta = {"type": "input_json_delta", "partial_json": part}
                await send(
                    {"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"
                )
            await send({"type": "content_block_stop", "index": index}, "content_block_stop")
            index += 1
        stop = "tool_use" if reply.tool_calls else "end_turn"
        await send(
            {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": usage[1]}},
            "message_delta",
        )
        await send({"type": "message_stop"}, "message_stop")
    await response.write_eof()
    return response
