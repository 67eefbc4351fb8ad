"""Provider-neutral request and response values for the LLM client.

Translators (openai.py, anthropic.py) map these to and from each wire format; nothing above the LLM
layer ever sees a provider's JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from bot.catalog import ModelInfo
from bot.domain import Message, ToolCall, Usage
from bot.surrogates import scrub, scrub_json_text


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call: a name, a description and a JSON-schema for its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


Purpose = Literal["chat", "compaction", "consolidation", "embedding"]
"""Why a call is made; usage is counted per purpose, so /status shows what the bill is made of."""


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
    purpose: Purpose = "chat"


# Why a model stops mid-answer at its output limit: OpenAI (and compatible servers), Anthropic.
CUT_OFF_REASONS = frozenset({"length", "max_tokens", "model_context_window_exceeded"})
# Why a model stops because it will not answer: its content filter (OpenAI, Azure), a refusal (Anthropic).
REFUSAL_REASONS = frozenset({"content_filter", "refusal"})


@dataclass(slots=True)
class ChatResponse:
    """One model answer. Text and tool calls are scrubbed of lone surrogates as the answer is built
    (bot/surrogates.py): a provider's JSON may carry them, and no session file could store them."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    stop_reason: str = ""  # as the provider said it: "stop", "length", "end_turn", "max_tokens", ...
    refusal: bool = False  # the text is the model's refusal (OpenAI's ``refusal`` field), not an answer
    # The catalog id of the model that was asked (a fallback's after a failover); ``model`` is the name
    # the provider gave, often dated ("gpt-4.1-mini-2025-04-14"). Set by the client; "" if unknown.
    model_id: str = ""

    @property
    def cut_off(self) -> bool:
        """True when the answer ended at the output limit, so it is incomplete."""
        return self.stop_reason in CUT_OFF_REASONS

    @property
    def refused(self) -> bool:
        """True when the model (or its provider's filter) declined to answer: the text, if any, is
        what came before it stopped, or (``refusal``) the model's own words declining."""
        return self.refusal or self.stop_reason in REFUSAL_REASONS

    def __post_init__(self) -> None:
        self.content = scrub(self.content)
        self.tool_calls = tuple(
            ToolCall(scrub(c.id), scrub(c.name), scrub_json_text(c.arguments)) for c in self.tool_calls
        )


StreamEventKind = Literal["text", "tool_call", "usage", "done"]


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """An incremental piece of a streamed answer. The final ``done`` event carries the full response."""

    kind: StreamEventKind
    text: str = ""
    response: ChatResponse | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", scrub(self.text))


@dataclass(frozen=True, slots=True)
class Wire:
    """What a translator (``openai.py``, ``anthropic.py``) needs besides the request to build its POST:
    the model, the server (``None``: the provider's own), the key, the limits the client settled on."""

    model: ModelInfo
    base_url: str | None
    api_key: str | None
    max_tokens: int
    temperature: float | None
    timeout: httpx.Timeout
    stream: bool = False
