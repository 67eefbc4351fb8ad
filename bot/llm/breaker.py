"""The circuit breaker: a model of the failover chain that keeps failing with an outage is asked last.

During a primary's outage every call paid its tries, backoffs and timeouts before a fallback answered.
So once a model failed with an outage (:data:`OUTAGES`: 5xx, 529, a timeout, no connection) on
:data:`OPEN_AFTER` calls in a row, it is *skipped* for :data:`COOL_DOWN` seconds: the other models of
the chain are asked first, and it only after them. When the cool-down ends, the next call tries it in
its place again (one call: those that come meanwhile still skip it); if that fails with an outage too,
it is skipped for twice as long, up to :data:`MAX_COOL_DOWN`. Its first success closes the breaker.

A skipped model is still asked when every other model of the chain failed, so a fallback that cannot
answer either (its key refused) never costs the turn a model that is back, nor makes a primary's outage
look like a refused key. With a single model (no fallbacks, or a call for a named model such as a
summary's) nothing is skipped: the call waits for the model as before (bot/model_wait.py). A model
that answers with a refusal (4xx, a rate limit) is there: that neither opens the breaker nor counts
towards it, and it ends a run of outages. The thresholds are constants, not settings: they only decide
how soon the fallbacks go first, which no deployment needs to tune.

Opening logs ``llm_model_skipped`` once, closing ``llm_model_back``; ``LLMStats.skipped`` (in
/healthz) names the models skipped and since when.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog

from bot.errors import LLMError, LLMTimeout, LLMUnavailable
from bot.llm.stats import LLMStats

log = structlog.get_logger(__name__)

OPEN_AFTER = 2  # calls in a row that failed with an outage (each after all its tries)
COOL_DOWN = 30.0  # seconds a model is skipped once it opened
MAX_COOL_DOWN = 300.0  # the cool-down doubles up to this while the model keeps failing
OUTAGES: tuple[type[LLMError], ...] = (LLMUnavailable, LLMTimeout)


@dataclass(slots=True)
class _Breaker:
    failures: int = 0  # outage calls in a row
    until: float | None = None  # skipped until then (clock seconds); None: closed
    cool_down: float = COOL_DOWN


class Breakers:
    """One breaker per model, on ``clock`` (monotonic seconds). Only the client uses it:

    chain = breakers.order(chain)        # before a call: skipped models go last
    breakers.succeeded(model)            # after each model's call, one or the other
    breakers.failed(model, error)
    """

    def __init__(self, stats: LLMStats, clock: Callable[[], float]) -> None:
        self._stats = stats
        self._clock = clock
        self._breakers: dict[str, _Breaker] = {}

    def order(self, chain: list[str]) -> list[str]:
        """``chain`` with the models skipped now moved to its end; as it is when it has one model, or
        when all of them are skipped (there is nothing to ask first)."""
        if len(chain) < 2:
            return chain
        skipped = [model for model in chain if self._skips(model)]
        if not skipped or len(skipped) == len(chain):
            return chain
        return [model for model in chain if model not in skipped] + skipped

    def _skips(self, model: str) -> bool:
        breaker = self._breakers.get(model)
        if breaker is None or breaker.until is None:
            return False
        now = self._clock()
        if now < breaker.until:
            return True
        # The cool-down is over: this call tries the model. The calls that come while it does still
        # skip it, for as long again; its outcome then closes the breaker or sets the next cool-down.
        breaker.until = now + breaker.cool_down
        return False

    def succeeded(self, model: str) -> None:
        breaker = self._breakers.pop(model, None)
        if breaker is not None and breaker.until is not None:
            since = self._stats.skipped.pop(model, None)
            log.info("llm_model_back", model=model, skipped_since=since.isoformat() if since else None)

    def failed(self, model: str, error: LLMError) -> None:
        breaker = self._breakers.setdefault(model, _Breaker())
        if not isinstance(error, OUTAGES):  # it answered: no outage, whatever it said
            if breaker.until is None:
                del self._breakers[model]
            return
        breaker.failures += 1
        now = self._clock()
        if breaker.until is not None:  # tried again, and still failing
            breaker.cool_down = min(breaker.cool_down * 2, MAX_COOL_DOWN)
            breaker.until = now + breaker.cool_down
        elif breaker.failures >= OPEN_AFTER:
            breaker.until = now + breaker.cool_down
            self._stats.skipped[model] = datetime.now(UTC)
            log.warning(
                "llm_model_skipped",
                model=model,
                failures=breaker.failures,
                cool_down=breaker.cool_down,
                error=str(error),
            )
