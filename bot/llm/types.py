"""Provider-neutral request and response values for the LLM client.

Translators (openai.py, anthropic.py) map these to and from each wire format; nothing above the LLM
layer ever sees a provider's JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from bot.domain import Message, ToolCall, Usage


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call: a name, a description and a JSON-schema for its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One call to a chat model. ``system`` is separate because Anthropic wants it top-level."""

    messages: tuple[Message, ...]
    system: str = ""
    tools: tuple[ToolSpec, ...] = ()
    max_output_tokens: int | None = None
    temperature: float | None = None
    timeout: float | None = None
    model: str | None = None  # None: the client's configured primary model (and its fallbacks)


# Why a model stops mid-answer at its output limit: OpenAI (and compatible servers), Anthropic.
CUT_OFF_REASONS = frozenset({"length", "max_tokens", "model_context_window_exceeded"})


@dataclass(slots=True)
class ChatResponse:
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    stop_reason: str = ""  # as the provider said it: "stop", "length", "end_turn", "max_tokens", ...

    @property
    def cut_off(self) -> bool:
        """True when the answer ended at the output limit, so it is incomplete."""
        return self.stop_reason in CUT_OFF_REASONS


StreamEventKind = Literal["text", "tool_call", "usage", "done"]


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """An incremental piece of a streamed answer. The final ``done`` event carries the full response."""

    kind: StreamEventKind
    text: str = ""
    response: ChatResponse | None = None
