"""One streamed answer, read: its SSE events folded into deltas by the provider's decoder, within the idle
and size limits, ending with the whole answer.

The client opens the stream, checks its status and owns the response; :func:`stream_answer` only reads.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Protocol

import httpx
import structlog

from bot.errors import LLMTimeout, LLMUnavailable
from bot.llm import anthropic, openai
from bot.llm.answer import Quiet, Target, parse, read_whole, readable, too_large
from bot.llm.limits import MAX_STREAMED_CALLS, MAX_STREAMED_CHARS, MiB
from bot.llm.sse import SSETooLarge, SSEvent, iter_lines, iter_sse
from bot.llm.types import ChatResponse, StreamEvent

log = structlog.get_logger(__name__)


class _Decoder(Protocol):
    done: bool
    size: int

    @property
    def calls(self) -> int: ...

    @property
    def complete(self) -> bool: ...

    def feed(self, event: SSEvent) -> list[StreamEvent]: ...

    def finish(self) -> ChatResponse: ...


async def stream_answer(
    target: Target, response: httpx.Response, idle: float, whole: float
) -> AsyncGenerator[StreamEvent, None]:
    """Yield ``text`` and ``tool_call`` deltas as they arrive, then one ``done`` event with the whole answer.

    A silence longer than ``idle`` seconds is LLMTimeout (a read timeout too), unless the answer is
    complete by then (the decoder's ``complete``: a stop reason, every block closed) and only its end
    marker is missing: that answer is taken and logged. An answer sent whole (not as events) that
    takes longer than ``whole`` seconds is LLMTimeout; an answer past the limits of limits.py is
    LLMBadResponse; a stream that ends before the answer is complete is LLMUnavailable, also when it
    ends in the middle of an event (half a JSON chunk: a connection or a proxy that gave up, which
    another try may not meet, not a server that writes malformed JSON). The ``done``
    answer's tool-call ids are still the server's: the client makes them unique and counts the usage.
    """
    if "text/event-stream" not in response.headers.get("content-type", ""):
        # The server ignored stream=true (some compatible servers do): a whole answer.
        final = parse(target, await read_whole(target, response, idle, whole))
        for event in _replay(final):
            yield event
    else:
        decoder: _Decoder = (
            anthropic.StreamDecoder(target.model, target.where)
            if target.provider == "anthropic"
            else openai.StreamDecoder(target.model, target.where)
        )
        lines = Quiet(iter_lines(response.aiter_text()), idle, target)
        # Until the answer's first words any line shows the server at work, keep-alives included: a
        # proxy's comments (OpenRouter's ": OPENROUTER PROCESSING") or Anthropic's pings while a model
        # thinks for longer than the idle limit, which cut it and then its retry. The lines' own limit
        # bounds that wait. From the first words on, keep-alives (comments, pings) are bytes but no
        # progress: only events that carry something count, or a hung answer stayed open until the
        # turn's deadline.
        found = Quiet(_events(iter_sse(lines), target), None, target)
        try:
            async for sse in found:
                if _cut_short(sse):
                    break  # the body ended in the middle of this event: the answer is incomplete (below)
                with readable(target):
                    events = list(decoder.feed(sse))
                if decoder.size > MAX_STREAMED_CHARS:
                    raise too_large(target, f"over {MAX_STREAMED_CHARS // MiB} Mi characters")
                if decoder.calls > MAX_STREAMED_CALLS:
                    raise too_large(target, f"over {MAX_STREAMED_CALLS} tool calls")
                if events:
                    found.idle = idle
                for event in events:
                    yield event
                if decoder.done:
                    break
        except (LLMTimeout, httpx.TimeoutException):
            if not decoder.complete:
                raise
            # Whole (a stop reason, every block closed), then only silence: a server or a proxy that
            # holds the connection open instead of sending the end. Taken, not asked for again and
            # paid twice.
            log.warning("llm_stream_silent_after_its_end", model=target.model, server=target.where)
        if not decoder.complete:
            raise LLMUnavailable(
                f"{target.where} ended the stream before the answer was complete", model=target.model
            )
        with readable(target):
            final = decoder.finish()
    yield StreamEvent("done", response=final)


def _cut_short(event: SSEvent) -> bool:
    """Whether the stream ended inside ``event`` before its data was whole (JSON that does not parse)."""
    if not event.cut or event.data.strip() == "[DONE]":
        return False
    try:
        json.loads(event.data)
    except (ValueError, RecursionError):  # (cut inside data nested deeper than the parser goes)
        return True
    return False


async def _events(events: AsyncIterator[SSEvent], target: Target) -> AsyncIterator[SSEvent]:
    """The events that carry something (Anthropic's ``ping`` does not; comments never arrive here); a
    line or an event past its limit (limits.py) is an answer too large."""
    try:
        async for event in events:
            if event.event != "ping":
                yield event
    except SSETooLarge as exc:
        raise too_large(target, str(exc)) from None


def _replay(final: ChatResponse) -> Iterator[StreamEvent]:
    if final.content:
        yield StreamEvent("text", text=final.content)
    for call in final.tool_calls:
        yield StreamEvent("tool_call", text=call.name)
