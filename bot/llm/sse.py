"""Server-sent events, as both LLM APIs stream them: ``event:`` and ``data:`` lines, blank-line separated;
and :class:`StreamFold`, what both APIs' stream decoders keep while they fold events into one answer."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from bot.domain import ToolCall, Usage
from bot.errors import LLMBadResponse
from bot.llm.types import ChatResponse, StreamEvent


@dataclass(frozen=True, slots=True)
class SSEvent:
    event: str
    data: str


async def iter_sse(lines: AsyncIterator[str]) -> AsyncIterator[SSEvent]:
    """Group raw lines into events; comments (``:``) are skipped, multi-line data is joined with newlines."""
    event = ""
    data: list[str] = []
    async for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data or event:
                yield SSEvent(event or "message", "\n".join(data))
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
    if data:
        yield SSEvent(event or "message", "\n".join(data))


class StreamFold:
    """The answer so far: text, tool calls by index (``id``, ``name``, ``arguments`` as streamed JSON
    text), usage, stop reason and the model that served it. A provider's decoder (``openai.py``,
    ``anthropic.py``) reads its own event shapes into these and sets ``done`` at the stream's end.

    ``size`` (characters of text and arguments kept) and ``calls`` (tool calls begun) are what the
    answer holds so far: the client stops a stream that grows past its limits (bot/llm/limits.py).
    The text is kept in one buffer, not as its deltas, so a stream of one-character deltas costs
    what its text does."""

    def __init__(self, model: str, where: str) -> None:
        self._model = model
        self._where = where
        self._text = io.StringIO()
        self._calls: dict[int, dict[str, str]] = {}
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
        except json.JSONDecodeError:
            raise LLMBadResponse(f"{self._where} streamed malformed JSON", model=self._model) from None
        if not isinstance(parsed, dict):
            raise LLMBadResponse(f"{self._where} streamed an unexpected {what}", model=self._model)
        return parsed

    def _said(self, text: str) -> list[StreamEvent]:
        self._text.write(text)
        self.size += len(text)
        return [StreamEvent("text", text=text)]

    def _argued(self, call: dict[str, str], arguments: str, *, restart: bool = False) -> None:
        """Add a fragment to a call's arguments (``restart``: in place of what it had)."""
        call["arguments"] = arguments if restart else call["arguments"] + arguments
        self.size += len(arguments)

    def _call(self, index: int) -> dict[str, str]:
        return self._calls.setdefault(index, {"id": "", "name": "", "arguments": ""})

    def finish(self) -> ChatResponse:
        """The whole answer. A call keeps the id the server sent, "" if none: the client makes each id
        unique in the conversation (call_ids.py)."""
        calls = tuple(
            ToolCall(c["id"], c["name"], c["arguments"] or "{}") for _, c in sorted(self._calls.items())
        )
        model = self._served_by or self._model
        return ChatResponse(self._text.getvalue(), calls, self._usage, model, self._stop)
