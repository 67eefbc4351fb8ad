"""LLM call statistics: what /status, /healthz and /metrics report about the model provider."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from bot.domain import Usage


@dataclass
class LLMStats:
    """What the client has seen since start. Only :class:`~bot.llm.client.LLMClient` writes it.

    ``calls`` counts successful calls; ``failures`` every failed attempt (each retry counts);
    ``retries`` the backoff waits; ``failovers`` the switches to the next model of the chain.
    ``last_ok`` is ``None`` until the first attempt, then whether the latest attempt succeeded;
    ``last_error`` is the latest failure (cleared by a success). ``by_model`` adds up tokens and cost
    per model id.
    """

    calls: int = 0
    failures: int = 0
    retries: int = 0
    failovers: int = 0
    last_ok: bool | None = None
    last_error: str | None = None
    last_call_at: datetime | None = None
    last_model: str | None = None
    last_latency: float | None = None  # seconds, latest successful call
    by_model: dict[str, Usage] = field(default_factory=dict)

    def succeeded(self, model: str, usage: Usage, latency: float) -> None:
        self.calls += 1
        self.last_ok, self.last_error, self.last_model = True, None, model
        self.last_call_at, self.last_latency = datetime.now(UTC), latency
        self.by_model.setdefault(model, Usage()).add(usage)

    def failed(self, model: str, error: Exception) -> None:
        self.failures += 1
        self.last_ok, self.last_error, self.last_model = False, f"{type(error).__name__}: {error}", model
        self.last_call_at = datetime.now(UTC)
