"""What the fake LLM server puts on the wire: scripted replies, JSON bodies and SSE streams.

The shapes follow the real APIs: OpenAI ``chat.completion`` objects and ``chat.completion.chunk`` SSE
chunks ending in ``data: [DONE]`` (tool-call arguments streamed in fragments keyed by ``index``, usage in a
last chunk with empty ``choices`` when ``stream_options.include_usage`` is set); Anthropic ``message``
objects and named events (``message_start``, ``content_block_*``, ``message_delta``, ``message_stop``,
``ping``, and ``error`` mid-stream with HTTP 200).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

Usage3 = tuple[int, int, int]  # input (including cached), output, cached


@dataclass
class FakeReply:
    """One scripted answer. Defaults: HTTP 200 with ``text``; usage estimated from the request.

    ``tool_calls``: ``(name, arguments)`` pairs, arguments as a JSON string (sent as-is, may be invalid
    for OpenAI) or a dict. ``status`` >= 400 sends ``error`` (or the API's standard error body) with
    ``headers``. ``delay`` waits before answering (cancelled when the client goes away), and ``hold``
    until that event is set (a turn held at the model for as long as a test needs, no clock involved).
    ``stall_after=n`` hangs (for ``stall`` seconds) once the answer has started: after ``n`` SSE
    events when streaming, else after the headers and the first ``n`` bytes of the JSON body.
    ``malformed`` sends broken JSON (or a broken SSE chunk when streaming). ``cut_off`` reports the
    answer as stopped at the output limit (OpenAI ``finish_reason: length``, Anthropic ``stop_reason:
    max_tokens``), as the APIs do when ``max_tokens`` runs out mid-answer. ``stream_error_after=n``
    fails a streamed answer after ``n`` text pieces: Anthropic sends an ``error`` event of type
    ``stream_error``, OpenAI drops the connection (or, given ``openai_error``, sends a last chunk
    with that ``error`` object and ``finish_reason: "error"``, as OpenRouter and LiteLLM do). Not
    streamed, ``openai_error`` is the choice's ``error`` (OpenRouter's ``choices[0].error``), sent
    with the ``finish_reason`` of ``stop`` (``stop="error"`` without it: an error that names none).
    ``usage=(input, output)`` and ``cached_tokens`` set the reported token counts. ``call_ids``: the
    id sent for each tool call, in order (``None``: no id at all), as local servers that repeat or
    omit ids send them; by default each gets a fresh one.
    ``flood=n``: an answer that never ends, like a model repeating itself with ``max_tokens`` ignored:
    ``n`` characters of text in 64 KiB pieces (text deltas when streaming, else one JSON body; streamed
    with ``tool_calls``, the first call's argument fragments instead), then ``stall`` seconds of
    silence, the answer still open. Streamed, ``flood_as`` may instead send them as one ``line`` that
    never ends, or as the ``data:`` lines of one ``event`` that never ends. ``raw_unicode``: JSON with
    non-ASCII characters as they are, not ``\\u`` escapes, as servers built on pydantic send it.
    ``drip=s``: the body (an error's too; asked to stream, a whole JSON answer, as a server that ignores
    ``stream``) goes out one byte every ``s`` seconds, then spaces at that pace for ``stall`` seconds:
    never silent for long, never done. ``keepalive_data``: while stalled (``keepalive``), an event
    ``data: <it>`` that carries nothing, in place of the comment. ``cut_after=n``: a streamed answer
    ends after ``n`` whole SSE events, in the middle of the next one (half its data, no blank line
    after it), with a proper end of the body: as a proxy that gives up waiting for the model ends its
    own answer. ``end_after=n``: a streamed answer whose body ends properly after ``n`` whole SSE events,
    the rest never sent, as a proxy or a connection that closes cleanly between two events (Anthropic:
    ``end_after`` at the ``message_stop`` event's place sends all but it). ``stop``: the stop reason sent in place of the usual one (OpenAI's
    ``finish_reason``, Anthropic's ``stop_reason``), such as ``content_filter`` or ``refusal``.
    ``refusal``: OpenAI's refusal text, sent in ``message.refusal`` (streamed: ``delta.refusal``).
    ``html``: a web page sent with HTTP 200 in place of the answer (also to a request that streams),
    as a chat UI or a proxy's login page answers a request sent to the wrong address. ``no_choices``:
    an OpenAI answer with an empty ``choices`` (and its usage), as OpenRouter sends now and then when
    the provider it routed to produced nothing (speakeasy-api/gram#3129). ``no_usage``: no token
    counts at all, as OpenAI-compatible servers that ignore ``stream_options.include_usage`` send
    (no usage chunk, no ``usage`` field; Anthropic: none in ``message_start`` or ``message_delta``).
    """

    text: str = ""
    tool_calls: list[tuple[str, str | dict[str, Any]]] = field(default_factory=list)
    status: int = 200
    error: dict[str, Any] | str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    hold: asyncio.Event | None = None  # answers once it is set (a turn held at the model)
    malformed: bool = False
    cut_off: bool = False
    stream_error_after: int | None = None
    stream_error: str = "overloaded_error"
    openai_error: dict[str, Any] | None = None
    usage: tuple[int, int] | None = None
    cached_tokens: int = 0
    stall_after: int | None = None
    stall: float = 60.0
    keepalive: float | None = None  # while stalled, an SSE comment (": keep-alive") this often
    keepalive_data: str | None = None
    call_ids: list[str | None] | None = None
    flood: int | None = None
    flood_as: Literal["deltas", "line", "event"] = "deltas"
    raw_unicode: bool = False
    drip: float | None = None
    cut_after: int | None = None
    end_after: int | None = None
    stop: str | None = None
    refusal: str = ""
    html: str | None = None
    no_choices: bool = False
    no_usage: bool = False

    def ids(self, api: str) -> list[str | None]:
        """The id each tool call is sent with (``None``: sent without one)."""
        if self.call_ids is not None:
            return list(self.call_ids)
        return [call_id(api) for _ in self.tool_calls]


# What Azure OpenAI answers (HTTP 400) to a prompt its content filter flags.
AZURE_FILTERED = {
    "error": {
        "message": "The response was filtered due to the prompt triggering Azure OpenAI's content "
        "management policy. Please modify your prompt and retry. To learn more about our content "
        "filtering policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766",
        "type": None,
        "param": "prompt",
        "code": "content_filter",
        "status": 400,
        "innererror": {
            "code": "ResponsibleAIPolicyViolation",
            "content_filter_result": {
                "hate": {"filtered": False, "severity": "safe"},
                "self_harm": {"filtered": False, "severity": "safe"},
                "sexual": {"filtered": False, "severity": "safe"},
                "violence": {"filtered": True, "severity": "medium"},
            },
        },
    }
}


def tokens(text: str) -> int:
    """About four characters per token, as the providers' own rule of thumb says."""
    return max(1, (len(text) + 3) // 4) if text else 0


def usage_of(body: dict[str, Any], reply: FakeReply) -> Usage3:
    """(input, output, cached): the scripted numbers, else an estimate from the request and reply."""
    if reply.usage is not None:
        return reply.usage[0], reply.usage[1], reply.cached_tokens
    prompt = json.dumps([body.get("system", ""), body["messages"], body.get("tools", [])])
    answer = reply.text + "".join(n + args_text(a) for n, a in reply.tool_calls)
    return tokens(prompt), max(1, tokens(answer)), reply.cached_tokens


def args_text(args: str | dict[str, Any]) -> str:
    return args if isinstance(args, str) else json.dumps(args)


def args_object(args: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(args, dict):
        return args
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def call_id(api: str) -> str:
    return ("toolu_" if api == "anthropic" else "call_") + uuid.uuid4().hex[:12]


def openai_usage(usage: Usage3) -> dict[str, Any]:
    return {
        "prompt_tokens": usage[0],
        "completion_tokens": usage[1],
        "total_tokens": usage[0] + usage[1],
        "prompt_tokens_details": {"cached_tokens": usage[2]},
    }


def anthropic_usage(usage: Usage3) -> dict[str, Any]:
    # Anthropic counts cache reads apart from input_tokens.
    return {
        "input_tokens": usage[0] - usage[2],
        "cache_read_input_tokens": usage[2],
        "cache_creation_input_tokens": 0,
        "output_tokens": usage[1],
    }


def openai_finish(reply: FakeReply) -> str:
    if reply.stop is not None:
        return reply.stop
    return "length" if reply.cut_off else "tool_calls" if reply.tool_calls else "stop"


def anthropic_stop(reply: FakeReply) -> str:
    if reply.stop is not None:
        return reply.stop
    return "max_tokens" if reply.cut_off else "tool_use" if reply.tool_calls else "end_turn"


def openai_body(body: dict[str, Any], reply: FakeReply, usage: Usage3) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.refusal:
        message["refusal"] = reply.refusal
    if reply.tool_calls:
        message["tool_calls"] = [
            _with_id({"type": "function", "function": {"name": n, "arguments": args_text(a)}}, i)
            for (n, a), i in zip(reply.tool_calls, reply.ids("openai"), strict=True)
        ]
    answer = {
        "id": "chatcmpl-" + uuid.uuid4().hex[:8],
        "object": "chat.completion",
        "model": body["model"],
        "choices": []
        if reply.no_choices
        else [_choice({"index": 0, "message": message, "finish_reason": openai_finish(reply)}, reply)],
        "usage": openai_usage(usage),
    }
    if reply.no_usage:
        del answer["usage"]
    return answer


def _choice(choice: dict[str, Any], reply: FakeReply) -> dict[str, Any]:
    return choice if reply.openai_error is None else {**choice, "error": reply.openai_error}


def anthropic_body(body: dict[str, Any], reply: FakeReply, usage: Usage3) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    for (name, args), i in zip(reply.tool_calls, reply.ids("anthropic"), strict=True):
        content.append(_with_id({"type": "tool_use", "name": name, "input": args_object(args)}, i))
    answer = {
        "id": "msg_" + uuid.uuid4().hex[:8],
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": anthropic_stop(reply),
        "stop_sequence": None,
        "usage": anthropic_usage(usage),
    }
    if reply.no_usage:
        del answer["usage"]
    return answer


def _with_id(call: dict[str, Any], id_: str | None) -> dict[str, Any]:
    return call if id_ is None else {"id": id_, **call}


def pieces(text: str, parts: int = 3) -> list[str]:
    """Split text into a few deltas, as a model streams it."""
    if not text:
        return []
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


class _Sse:
    def __init__(self, response: web.StreamResponse, reply: FakeReply) -> None:
        self._response = response
        self._reply = reply
        self._sent = 0
        self._ended = False

    async def send(self, data: dict[str, Any] | str, event: str | None = None) -> None:
        if self._ended:
            return
        if self._sent == self._reply.cut_after:  # the body ends inside this event (see FakeReply)
            text = data if isinstance(data, str) else json.dumps(data)
            prefix = f"event: {event}\n" if event else ""
            await self._response.write(f"{prefix}data: {text[: len(text) // 2]}".encode())
            await self._response.write_eof()
            self._ended = True
            return
        if self._sent == self._reply.end_after:  # the body ends cleanly before this event
            await self._response.write_eof()
            self._ended = True
            return
        if self._sent == self._reply.stall_after:  # a server hung mid-answer (only pinging, maybe)
            every = self._reply.keepalive
            if every is None:
                await asyncio.sleep(self._reply.stall)
            else:
                empty = self._reply.keepalive_data
                beat = b": keep-alive\n\n" if empty is None else f"data: {empty}\n\n".encode()
                for _ in range(int(self._reply.stall / every)):
                    await self._response.write(beat)
                    await asyncio.sleep(every)
        self._sent += 1
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=not self._reply.raw_unicode)
        prefix = f"event: {event}\n" if event else ""
        await self._response.write(f"{prefix}data: {text}\n\n".encode())
        await asyncio.sleep(0)  # let the chunks travel separately, as over a real network


async def send_stalling(
    request: web.Request, payload: dict[str, Any], reply: FakeReply
) -> web.StreamResponse:
    """A JSON answer whose body stops after ``reply.stall_after`` bytes, for ``reply.stall`` seconds."""
    assert reply.stall_after is not None
    body = json.dumps(payload).encode()
    response = web.StreamResponse(headers={"content-type": "application/json", **reply.headers})
    await response.prepare(request)
    await response.write(body[: reply.stall_after])
    await asyncio.sleep(reply.stall)
    await response.write(body[reply.stall_after :])
    await response.write_eof()
    return response


async def send_dripping(request: web.Request, body: bytes, reply: FakeReply) -> web.StreamResponse:
    """``body`` with ``reply.status``, a byte every ``reply.drip`` seconds, then spaces at that pace for
    ``reply.stall`` seconds (whitespace after JSON is still JSON): each read comes soon, the end never."""
    assert reply.drip is not None
    response = web.StreamResponse(
        status=reply.status, headers={"content-type": "application/json", **reply.headers}
    )
    await response.prepare(request)
    for i in range(len(body)):
        await response.write(body[i : i + 1])
        await asyncio.sleep(reply.drip)
    for _ in range(int(reply.stall / reply.drip)):
        await response.write(b" ")
        await asyncio.sleep(reply.drip)
    await response.write_eof()
    return response


FLOOD_PIECE = 64 * 1024


async def send_flood(
    request: web.Request, api: str, body: dict[str, Any], reply: FakeReply
) -> web.StreamResponse:
    """``reply.flood`` characters of one answer's text (streamed with ``tool_calls``: of the first
    call's arguments), then a hang: the answer is never finished."""
    assert reply.flood is not None
    sizes = [FLOOD_PIECE] * (reply.flood // FLOOD_PIECE) + [reply.flood % FLOOD_PIECE]
    if not body.get("stream"):
        response = web.StreamResponse(headers={"content-type": "application/json"})
        await response.prepare(request)
        message = {"role": "assistant", "content": ""}
        opening = json.dumps(
            {"model": body["model"], "choices": [{"index": 0, "message": message}]}
            if api == "openai"
            else {"type": "message", "role": "assistant", "content": [{"type": "text", "text": ""}]}
        )
        await response.write(opening[: opening.index('""') + 1].encode())  # up to the open string
        for size in sizes:
            await response.write(b"x" * size)
        await asyncio.sleep(reply.stall)
        return response
    response, sse = await _open(request, reply)
    if reply.flood_as != "deltas":
        for i, size in enumerate(sizes):
            if reply.flood_as == "line":  # one chunk's JSON, never ended by a newline
                await response.write((b'data: {"text": "' if i == 0 else b"") + b"x" * size)
            else:  # data lines, never ended by the blank line that ends an event
                await response.write(b"data: " + b"x" * size + b"\n")
            await asyncio.sleep(0)
        await asyncio.sleep(reply.stall)
        return response
    name = reply.tool_calls[0][0] if reply.tool_calls else None
    if api == "openai":
        base = {"id": "chatcmpl-f", "object": "chat.completion.chunk", "model": body["model"]}

        def piece(text: str, first: bool = False) -> dict[str, Any]:
            if name is None:
                return {**base, "choices": [{"index": 0, "delta": {"content": text}}]}
            call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
            if first:
                call.update(id="call_flood", type="function", function={"name": name, "arguments": ""})
            return {**base, "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}

        await sse.send(piece("", first=True))
        for size in sizes:
            await sse.send(piece("x" * size))
    else:
        message = {"id": "msg_f", "type": "message", "role": "assistant", "model": body["model"]}
        await sse.send({"type": "message_start", "message": {**message, "content": []}}, "message_start")
        block = (
            {"type": "text", "text": ""}
            if name is None
            else {"type": "tool_use", "id": "toolu_flood", "name": name, "input": {}}
        )
        await sse.send(
            {"type": "content_block_start", "index": 0, "content_block": block}, "content_block_start"
        )
        for size in sizes:
            delta = (
                {"type": "text_delta", "text": "x" * size}
                if name is None
                else {"type": "input_json_delta", "partial_json": "x" * size}
            )
            await sse.send({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta")
    await asyncio.sleep(reply.stall)
    return response


async def _open(request: web.Request, reply: FakeReply) -> tuple[web.StreamResponse, _Sse]:
    response = web.StreamResponse(
        headers={"content-type": "text/event-stream", "cache-control": "no-cache", **reply.headers}
    )
    await response.prepare(request)
    return response, _Sse(response, reply)


async def stream_openai(
    request: web.Request, body: dict[str, Any], reply: FakeReply, usage: Usage3
) -> web.StreamResponse:
    response, sse = await _open(request, reply)
    base = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "model": body["model"]}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    await sse.send(chunk({"role": "assistant", "content": ""}))
    if reply.malformed:
        await sse.send('{"choices": [{"delta": ')
    for i, piece in enumerate(pieces(reply.text)):
        if reply.stream_error_after is not None and i >= reply.stream_error_after:
            break
        await sse.send(chunk({"content": piece}))
    for piece in pieces(reply.refusal):
        await sse.send(chunk({"refusal": piece}))
    if reply.stream_error_after is not None and reply.openai_error is not None:
        failed = {**chunk({"content": ""}, "error"), "error": reply.openai_error}
        await sse.send(failed)
        await response.write_eof()
        return response
    if reply.stream_error_after is not None:
        assert request.transport is not None
        request.transport.close()  # OpenAI has no error event: the connection just drops mid-answer
        return response
    for index, ((name, args), id_) in enumerate(zip(reply.tool_calls, reply.ids("openai"), strict=True)):
        first = _with_id({"index": index, "type": "function"}, id_)
        await sse.send(chunk({"tool_calls": [{**first, "function": {"name": name, "arguments": ""}}]}))
        for part in pieces(args_text(args)):
            await sse.send(chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]}))
    await sse.send(chunk({}, openai_finish(reply)))
    if (body.get("stream_options") or {}).get("include_usage") and not reply.no_usage:
        await sse.send({**base, "choices": [], "usage": openai_usage(usage)})
    await sse.send("[DONE]")
    await response.write_eof()
    return response


async def stream_anthropic(
    request: web.Request, body: dict[str, Any], reply: FakeReply, usage: Usage3
) -> web.StreamResponse:
    response, sse = await _open(request, reply)
    start_usage = {**anthropic_usage(usage), "output_tokens": 1}
    message = {"id": "msg_s", "type": "message", "role": "assistant", "model": body["model"], "content": []}
    if not reply.no_usage:
        message["usage"] = start_usage
    await sse.send({"type": "message_start", "message": message}, "message_start")
    await sse.send({"type": "ping"}, "ping")
    if reply.malformed:
        await sse.send('{"type": "content_block_delta", "delta": ', "content_block_delta")
    index = 0
    texts = pieces(reply.text)
    if texts or reply.stream_error_after is not None:
        block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        await sse.send(block, "content_block_start")
        for i, piece in enumerate([*texts, None]):
            if reply.stream_error_after is not None and i >= reply.stream_error_after:
                error = {"type": reply.stream_error, "message": reply.stream_error.replace("_", " ")}
                await sse.send({"type": "error", "error": error}, "error")
                await response.write_eof()
                return response
            if piece is not None:
                delta = {"type": "text_delta", "text": piece}
                await sse.send(
                    {"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta"
                )
        await sse.send({"type": "content_block_stop", "index": 0}, "content_block_stop")
        index = 1
    for (name, args), id_ in zip(reply.tool_calls, reply.ids("anthropic"), strict=True):
        block = _with_id({"type": "tool_use", "name": name, "input": {}}, id_)
        await sse.send(
            {"type": "content_block_start", "index": index, "content_block": block}, "content_block_start"
        )
        for part in pieces(json.dumps(args_object(args))):
            delta = {"type": "input_json_delta", "partial_json": part}
            await sse.send(
                {"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"
            )
        await sse.send({"type": "content_block_stop", "index": index}, "content_block_stop")
        index += 1
    delta = {"stop_reason": anthropic_stop(reply), "stop_sequence": None}
    counted = {} if reply.no_usage else {"usage": {"output_tokens": usage[1]}}
    await sse.send({"type": "message_delta", "delta": delta, **counted}, "message_delta")
    await sse.send({"type": "message_stop"}, "message_stop")
    await response.write_eof()
    return response
