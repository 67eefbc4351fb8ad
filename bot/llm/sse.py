"""Server-sent events, as both LLM APIs stream them: ``event:`` and ``data:`` lines, blank-line separated;
and :class:`StreamFold`, what both APIs' stream decoders keep while they fold events into one answer."""

from __future__ import annotations

import io
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from bot.domain import ToolCall, Usage
from bot.errors import LLMBadResponse
from bot.llm.limits import MAX_EVENT_CHARS, MiB
from bot.llm.types import ChatResponse, StreamEvent

_LINE_END = re.compile(r"\r\n|\r|\n")  # the SSE spec's three; not the other Unicode breaks


@dataclass(frozen=True, slots=True)
class SSEvent:
    """One event. ``cut``: the stream ended inside it, before the blank line that ends an event."""

    event: str
    data: str
    cut: bool = False


class SSETooLarge(Exception):
    """A line or one event's data past ``MAX_EVENT_CHARS``; the client reports it as any answer too large."""


async def iter_lines(chunks: AsyncIterator[str], limit: int = MAX_EVENT_CHARS) -> AsyncIterator[str]:
    """The lines of a stream's text, without their ends; a line longer than ``limit`` is SSETooLarge.

    In place of httpx's ``aiter_lines``, which keeps a line that never ends without limit, and splits at
    every Unicode line break (U+2028 in a model's text, sent raw inside a JSON string, cut its chunk in
    two). An event stream ends its lines at CR, LF or CRLF only.
    """
    # A line that a chunk holds whole is yielded as split, with no copy; the start of one that goes on
    # in later chunks waits in one buffer, however many chunks bring it, emptied for the next such line.
    started = io.StringIO()
    after_cr = False  # the last chunk ended in CR: a LF first in this one belongs to it
    async for chunk in chunks:
        if after_cr and chunk.startswith("\n"):
            chunk = chunk[1:]
        after_cr = chunk.endswith("\r")
        # ``rest`` goes on in the next chunk; str.split is several times faster than the pattern's
        *ended, rest = _LINE_END.split(chunk) if "\r" in chunk else chunk.split("\n")
        for line in ended:
            if started.tell():
                started.write(line)
                line = started.getvalue()
                started.seek(0)
                started.truncate()
            if len(line) > limit:
                raise SSETooLarge(f"a line over {limit // MiB} Mi characters")
            yield line
        if rest:
            started.write(rest)
            if started.tell() > limit:
                raise SSETooLarge(f"a line over {limit // MiB} Mi characters")
    if started.tell():
        yield started.getvalue()


async def iter_sse(lines: AsyncIterator[str], limit: int = MAX_EVENT_CHARS) -> AsyncIterator[SSEvent]:
    """Group raw lines into events; comments (``:``) are skipped, multi-line data is joined with newlines.

    An event whose data passes ``limit`` characters is SSETooLarge: ``data:`` lines without a blank
    line after them were gathered without end. The data is kept in one buffer, as it comes. An event
    the stream ends inside (no blank line after it) is still yielded, marked ``cut``: some servers
    leave out the last blank line, and a stream cut off in the middle of an event is told by its data.
    """
    event = ""
    data = io.StringIO()
    lines_of_data = 0
    async for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if lines_of_data or event:
                yield SSEvent(event or "message", data.getvalue())
            event, data, lines_of_data = "", io.StringIO(), 0
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            if lines_of_data:
                data.write("\n")
            data.write(value)
            lines_of_data += 1
            if data.tell() > limit:
                raise SSETooLarge(f"an event over {limit // MiB} Mi characters")
    if lines_of_data:
        yield SSEvent(event or "message", data.getvalue(), cut=True)


@dataclass(slots=True)
class _Call:
    """A tool call as it streams in. Its arguments are written to one buffer, like the answer's text:
    added to one string, each fragment copied all that came before it (quadratic time for many tiny
    ones), and kept as a list of fragments, each tiny one cost some fifty bytes of memory."""

    id: str = ""
    name: str = ""
    arguments: io.StringIO = field(default_factory=io.StringIO)


class StreamFold:
    """The answer so far: text, tool calls by index (``id``, ``name``, ``arguments`` as the streamed
    JSON text), usage, stop reason and the model that served it. A provider's decoder (``openai.py``,
    ``anthropic.py``) reads its own event shapes into these and sets ``done`` at the stream's end.

    ``size`` (characters of text and arguments kept) and ``calls`` (tool calls begun) are what the
    answer holds so far: the client stops a stream that grows past its limits (bot/llm/limits.py).
    The text is kept in one buffer, not as its deltas, so a stream of one-character deltas costs
    what its text does."""

    def __init__(self, model: str, where: str) -> None:
        self._model = model
        self._where = where
        self._text = io.StringIO()
        self._calls: dict[int, _Call] = {}
        self._usage = Usage(calls=1)
        self._stop = ""
        self._served_by = ""
        self.done = False
        self.size = 0

    @property
    def calls(self) -> int:
        return len(self._calls)

    def _object(self, data: str, what: str) -> dict[str, Any]:
        """One event's JSON object; anything else is the provider's fault, said as such."""
        try:
            parsed = json.loads(data) if data else {}
        except (json.JSONDecodeError, RecursionError):
            raise LLMBadResponse(f"{self._where} streamed malformed JSON", model=self._model) from None
        if not isinstance(parsed, dict):
            raise LLMBadResponse(f"{self._where} streamed an unexpected {what}", model=self._model)
        return parsed

    def _said(self, text: str) -> list[StreamEvent]:
        self._text.write(text)
        self.size += len(text)
        return [StreamEvent("text", text=text)]

    def _argued(self, call: _Call, arguments: str, *, restart: bool = False) -> None:
        """Add a fragment to a call's arguments (``restart``: in place of what it had)."""
        if restart:
            call.arguments = io.StringIO()
        call.arguments.write(arguments)
        self.size += len(arguments)

    def _call(self, index: int) -> _Call:
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = _Call()
        return call

    def finish(self) -> ChatResponse:
        """The whole answer. A call keeps the id the server sent, "" if none: the client makes each id
        unique in the conversation (call_ids.py)."""
        calls = tuple(
            ToolCall(c.id, c.name, c.arguments.getvalue() or "{}") for _, c in sorted(self._calls.items())
        )
        model = self._served_by or self._model
        return ChatResponse(self._text.getvalue(), calls, self._usage, model, self._stop)
