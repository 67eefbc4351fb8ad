"""LLM call statistics: what /status, /healthz and /metrics report about the model provider."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from bot.domain import Usage
from bot.errors import (
    LLMAuthError,
    LLMBadResponse,
    LLMContentFiltered,
    LLMContextOverflow,
    LLMRateLimited,
    LLMTimeout,
    LLMUnavailable,
)

_REASONS: tuple[tuple[type[Exception], str], ...] = (
    (LLMTimeout, "timeout"),
    (LLMRateLimited, "rate_limited"),
    (LLMAuthError, "auth"),
    (LLMContextOverflow, "context_overflow"),
    (LLMContentFiltered, "content_filter"),
    (LLMBadResponse, "bad_response"),
    (LLMUnavailable, "unavailable"),
)


def failure_reason(error: Exception) -> str:
    """A short, bounded label for a failed attempt (metrics must not get one label per message)."""
    return next((reason for kind, reason in _REASONS if isinstance(error, kind)), "error")


@dataclass
class LLMStats:
    """What the client has seen since start. Only :class:`~bot.llm.client.LLMClient` writes it.

    ``calls`` counts successful calls; ``failures`` every failed attempt (each retry counts);
    ``retries`` the backoff waits; ``failovers`` the switches to the next model of the chain.
    ``last_ok`` is ``None`` until the first attempt, then whether the latest attempt succeeded;
    ``last_error`` is the latest failure (cleared by a success). ``by_model`` and ``by_purpose`` add
    up tokens and cost per model id and per purpose (chat, compaction, consolidation);
    ``failures_by`` counts failed attempts per (model id, reason), so an operator sees which provider
    is the trouble and whether it is rate limits, timeouts or outages. ``skipped`` names the models the
    circuit breaker asks last for now (breaker.py), and since when.
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
    by_purpose: dict[str, Usage] = field(default_factory=dict)
    failures_by: dict[tuple[str, str], int] = field(default_factory=dict)
    skipped: dict[str, datetime] = field(default_factory=dict)

    def succeeded(self, model: str, usage: Usage, latency: float, purpose: str = "chat") -> None:
        self.calls += 1
        self.last_ok, self.last_error, self.last_model = True, None, model
        self.last_call_at, self.last_latency = datetime.now(UTC), latency
        self.by_model.setdefault(model, Usage()).add(usage)
        self.by_purpose.setdefault(purpose, Usage()).add(usage)

    def failed(self, model: str, error: Exception) -> None:
        self.failures += 1
        key = (model, failure_reason(error))
        self.failures_by[key] = self.failures_by.get(key, 0) + 1
        self.last_ok, self.last_error, self.last_model = False, f"{type(error).__name__}: {error}", model
        self.last_call_at = datetime.now(UTC)
