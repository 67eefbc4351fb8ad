"""The one interface membot's parts use to talk to a language model: :class:`ChatModel`.

:class:`bot.llm.LLMClient` implements it over HTTP; benchmarks and tests pass their own in-process
models to ``bot.app.build_core``. The tool loop streams the user's replies; compaction and memory
consolidation only ``chat``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from bot.llm.types import ChatRequest, ChatResponse, StreamEvent


class ChatModel(Protocol):
    """A chat model: one answer at once (``chat``) or as it is written (``stream``).

    ``stream`` yields the text as it comes and ends with one event that carries the whole
    :class:`ChatResponse`, the same value ``chat`` would have returned.
    """

    async def chat(self, request: ChatRequest) -> ChatResponse: ...

    def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]: ...
