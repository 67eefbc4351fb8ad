"""The LLM client's retry and failover policy: which models a call asks, whether a failed try is tried
again on the same model, how long to wait first, and which error a chain that failed throughout raises.

A concept of its own because these are decisions, not I/O: each is a function of the settings and of
the error's type (never its text), so it reads, and changes, apart from the sending, timing and
counting in client.py, which carries the decisions out. The circuit breaker (breaker.py), which moves a
failing model to the end of the chain, is the one decision that remembers past calls; this policy
remembers nothing.

Use (the client holds one)::

    policy = RetryPolicy(settings.llm, random.random)
    for model in policy.chain(request):
        ...  # a try failed with exc, the attempt-th (0-based) on this model:
        if policy.may_retry(exc, attempt):
            await asyncio.sleep(policy.delay(exc, attempt + 1))
    raise exhausted(failures)  # every model failed
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from bot.config import LLMSettings
from bot.errors import LLMError, LLMTimeout
from bot.llm.types import ChatRequest
from bot.retry import Backoff

log = structlog.get_logger(__name__)


class RetryPolicy:
    """The chain and the retries of one client's calls, as the ``llm`` settings set them (see the client's
    module docstring, steps 1, 3 and 4). ``rng`` gives the backoff's jitter, in [0, 1)."""

    def __init__(self, settings: LLMSettings, rng: Callable[[], float]) -> None:
        self._settings = settings
        self._rng = rng

    def chain(self, request: ChatRequest) -> list[str]:
        """The models a call asks, in order (the breaker may then put one last): the request's own
        model alone, or ``llm.model`` then ``llm.fallback_models``, each once."""
        if request.model:
            return [request.model]
        primary = self._settings.model
        return [primary, *dict.fromkeys(m for m in self._settings.fallback_models if m != primary)]

    def may_retry(self, exc: LLMError, attempt: int) -> bool:
        """Whether try ``attempt`` (0-based) may be followed by another on the same model."""
        limit = self._settings.max_retries
        if isinstance(exc, LLMTimeout):
            limit = min(limit, 1)
        if exc.retry_after is not None and exc.retry_after > self._settings.retry_max_delay:
            return False  # not before then, said the server: the capped wait would end too soon
        return exc.retryable and attempt < limit

    def delay(self, exc: Exception, tries: int) -> float:
        """The server's hint if it gave one, else exponential with jitter; never above the cap."""
        backoff = Backoff(self._settings.retry_base_delay, self._settings.retry_max_delay, jitter=self._rng)
        return backoff(tries - 1, hint=getattr(exc, "retry_after", None))


def exhausted(failures: list[LLMError]) -> LLMError:
    """The error of a chain whose every model failed (one per model, in order): the last one a later
    try may cure, else the last. The last is logged when it is not the one raised (the others were, at
    their failover), so the operator still learns of a fallback that is misconfigured.

    It carries the first model's Retry-After when that is longer than its own: the next try asks that
    model first, and before then it would only be refused again (and count against its rate limit)."""
    last = failures[-1]
    hopeful = next((exc for exc in reversed(failures) if exc.retryable), last)
    if hopeful is not last:
        log.warning("llm_fallback_failed", model=last.model, error=str(last), raised=str(hopeful))
    first = failures[0].retry_after
    if first is not None and first > (hopeful.retry_after or 0.0):
        hopeful.retry_after = first
    return hopeful
