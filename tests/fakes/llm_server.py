"""A local model server speaking the OpenAI chat-completions and Anthropic Messages wire formats.

It validates requests the way the real APIs do (``llm_checks.py``; a wrong translator gets the same 400
the real API would give), answers from a script of :class:`FakeReply` values or a ``responder``
function, and otherwise echoes the last user text. Streaming (SSE, with named events for Anthropic),
tool calls, error statuses with headers, slow and dripping answers, malformed bodies, mid-stream failures,
answers that never end and usage numbers are all scriptable::

    async with FakeLLMServer() as llm:
        llm.script(FakeReply(status=429, headers={"retry-after": "2"}), FakeReply(text="hi"))
        settings = LLMSettings(openai={"base_url": llm.openai_base_url})
        ...
        assert llm.requests[-1].body["messages"][-1]["content"] == "hello"
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes.llm_checks import check_anthropic, check_openai
from tests.fakes.llm_wire import (
    FLOOD_PIECE,
    FakeReply,
    anthropic_body,
    openai_body,
    send_dripping,
    send_flood,
    send_stalling,
    stream_anthropic,
    stream_openai,
    usage_of,
)

__all__ = ["FakeLLMServer", "FakeReply", "RecordedRequest"]


@dataclass
class RecordedRequest:
    api: str  # "openai" | "anthropic"
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


Responder = Callable[[str, dict[str, Any]], FakeReply | None]


class FakeLLMServer:
    """``async with FakeLLMServer() as llm``: a real HTTP server on 127.0.0.1, random port.

    ``anthropic_api_key`` / ``openai_api_key``: when set, requests must carry exactly that key (401
    otherwise). Anthropic always requires some ``x-api-key`` and ``anthropic-version: 2023-06-01``;
    OpenAI accepts a missing key (like Ollama) unless ``openai_api_key`` is set. ``strict_template``:
    the OpenAI endpoint also refuses what strict chat templates of local servers refuse (a second
    system message, two user messages in a row), with their 400. ``models``: what ``GET /v1/models``
    lists; ``models_flood=n``: that list sends ``n`` bytes of itself, never ends and hangs instead;
    ``models_drip=s``: it goes out a byte every ``s`` seconds, then spaces at that pace for a minute.
    """

    def __init__(
        self,
        *,
        openai_api_key: str | None = None,
        anthropic_api_key: str | None = None,
        strict_template: bool = False,
        models: tuple[str, ...] = ("gpt-4.1-mini",),
    ) -> None:
        self.strict_template = strict_template
        self.models = models
        self.models_flood: int | None = None
        self.models_drip: float | None = None
        self.requests: list[RecordedRequest] = []
        self.responder: Responder | None = None
        self.in_flight = 0
        self.port = 0
        self._openai_key = openai_api_key
        self._anthropic_key = anthropic_api_key
        self._script: deque[FakeReply] = deque()
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> FakeLLMServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/v1/messages", self._anthropic)
        app.router.add_get("/v1/models", self._models)
        # handler_cancellation: a slow reply stops when the client gives up, as a real server's would.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = int(self._runner.addresses[0][1])
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
        """Queue replies; each request takes the next one (before ``responder`` and the echo)."""
        self._script.extend(replies)

    @property
    def scripted(self) -> int:
        """Scripted replies not yet used."""
        return len(self._script)

    # -- handlers ---------------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.StreamResponse:
        # The listing wants the key as the chat endpoints do (Anthropic's way when x-api-key is sent).
        key = request.headers.get("x-api-key")
        if key is not None and self._anthropic_key is not None and key != self._anthropic_key:
            return _anthropic_error(401, "authentication_error", "invalid x-api-key")
        bearer = request.headers.get("authorization")
        if key is None and self._openai_key is not None and bearer != f"Bearer {self._openai_key}":
            error = {"message": "Incorrect API key provided.", "code": "invalid_api_key"}
            return web.json_response({"error": error}, status=401)
        if self.models_flood is not None:
            response = web.StreamResponse(headers={"content-type": "application/json"})
            await response.prepare(request)
            await response.write(b'{"object": "list", "data": [')
            for _ in range(self.models_flood // FLOOD_PIECE + 1):
                await response.write(b'{"id": "m"},'.ljust(FLOOD_PIECE))
            await asyncio.sleep(60)
            return response
        data = [{"id": model, "object": "model"} for model in self.models]
        if self.models_drip is not None:
            listing = json.dumps({"object": "list", "data": data}).encode()
            return await send_dripping(request, listing, FakeReply(drip=self.models_drip))
        return web.json_response({"object": "list", "data": data})

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        self.requests.append(RecordedRequest("openai", request.path, body or {}, dict(request.headers)))
        if (
            self._openai_key is not None
            and request.headers.get("authorization") != f"Bearer {self._openai_key}"
        ):
            message = "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys."
            error = {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}
            return web.json_response({"error": error}, status=401)
        problem = check_openai(body, strict_template=self.strict_template)
        if problem:
            error = {"message": problem, "type": "invalid_request_error", "param": None, "code": None}
            return web.json_response({"error": error}, status=400)
        assert body is not None
        return await self._answer("openai", request, body, self._next("openai", body))

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        self.requests.append(RecordedRequest("anthropic", request.path, body or {}, dict(request.headers)))
        key = request.headers.get("x-api-key")
        if not key or (self._anthropic_key is not None and key != self._anthropic_key):
            return _anthropic_error(401, "authentication_error", "invalid x-api-key")
        if request.headers.get("anthropic-version") != "2023-06-01":
            return _anthropic_error(400, "invalid_request_error", "anthropic-version: header is required")
        problem = check_anthropic(body)
        if problem:
            return _anthropic_error(400, "invalid_request_error", problem)
        assert body is not None
        return await self._answer("anthropic", request, body, self._next("anthropic", body))

    def _next(self, api: str, body: dict[str, Any]) -> FakeReply:
        if self._script:
            return self._script.popleft()
        if self.responder is not None:
            reply = self.responder(api, body)
            if reply is not None:
                return reply
        return FakeReply(text=f"echo: {_last_user_text(body)}")

    async def _answer(
        self, api: str, request: web.Request, body: dict[str, Any], reply: FakeReply
    ) -> web.StreamResponse:
        self.in_flight += 1
        try:
            if reply.delay:
                await asyncio.sleep(reply.delay)
            if reply.hold is not None:
                await reply.hold.wait()
            if reply.status >= 400:
                error = reply.error if reply.error is not None else _default_error(api, reply.status)
                text = error if isinstance(error, str) else json.dumps(error)
                if reply.drip is not None:
                    return await send_dripping(request, text.encode(), reply)
                return web.Response(
                    status=reply.status,
                    text=text,
                    headers={"content-type": "application/json", **reply.headers},
                )
            if reply.html is not None:
                return web.Response(text=reply.html, content_type="text/html", headers=reply.headers)
            if reply.flood is not None:
                return await send_flood(request, api, body, reply)
            usage = usage_of(body, reply)
            if reply.drip is not None:  # (asked to stream too: a server that ignores ``stream``)
                payload = (
                    openai_body(body, reply, usage) if api == "openai" else anthropic_body(body, reply, usage)
                )
                return await send_dripping(request, json.dumps(payload).encode(), reply)
            if body.get("stream"):
                streamer = stream_openai if api == "openai" else stream_anthropic
                return await streamer(request, body, reply, usage)
            if reply.malformed:
                return web.Response(text='{"choices": [{"message": ', content_type="application/json")
            payload = (
                openai_body(body, reply, usage) if api == "openai" else anthropic_body(body, reply, usage)
            )
            if reply.stall_after is not None:
                return await send_stalling(request, payload, reply)
            return web.json_response(payload, headers=reply.headers)
        finally:
            self.in_flight -= 1


async def _body(request: web.Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _anthropic_error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)


def _last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body["messages"]):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        texts = [b.get("text", "") for b in content if b.get("type") == "text"]
        return texts[-1] if texts else "done"
    return ""


def _default_error(api: str, status: int) -> dict[str, Any]:
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
        529: "overloaded_error",
    }
    kind = kinds.get(status, "api_error")
    message = kind.replace("_", " ")
    if api == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
