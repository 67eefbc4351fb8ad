"""Prometheus metrics: one registry per running membot, fed by small recording calls and scrape-time reads.

Why a dedicated :class:`~prometheus_client.CollectorRegistry` instead of the library's global one: two
membots in one process (tests, an embedding app) must not share or collide on counters, and nothing is
registered as a side effect of importing a module.

Two ways numbers get in:

- **Recording calls** from the code that sees the event, each holding the ``Metrics`` as its
  ``observer``: the dispatcher calls :meth:`Metrics.turn_finished` (a ``TurnObserver``), the tool loop
  :meth:`Metrics.tool_call` (a ``ToolObserver``), the compaction service :meth:`Metrics.compaction`
  (a ``CompactionObserver``) and memory's consolidator :meth:`Metrics.consolidation` (a
  ``ConsolidationObserver``). ``bot/app.py`` passes the one ``Metrics`` to all four.
- **Reads at scrape time** of state other parts already keep, so they need no hooks: the LLM client's
  :class:`~bot.llm.client.LLMStats` (calls, tokens, cost per model, failures, retries, failovers, the
  models the circuit breaker skips) and
  the dispatcher's queue depth, running turns and cached sessions (:meth:`Metrics.watch`).

    metrics = Metrics()
    dispatcher = Dispatcher(..., observer=metrics)  # and ToolLoopSystem, CompactionService, MemoryService
    metrics.watch(llm_stats=lambda: llm.stats, queued=dispatcher.total_queued, ...)
    text = metrics.render()  # what GET /metrics serves
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bot.llm import LLMStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Turns run from well under a second (a cached short answer) to many minutes (a long tool loop).
TURN_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0, 900.0)

IntSource = Callable[[], int]
StatsSource = Callable[[], LLMStats | None]


class Metrics:
    """membot's counters and gauges. Satisfies the dispatcher's ``TurnObserver``, the tool loop's
    ``ToolObserver``, compaction's ``CompactionObserver`` and memory's ``ConsolidationObserver``
    protocols, so it is passed as ``observer=`` to all four."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self._turns = Counter(
            "membot_turns", "Finished turns by channel and outcome.", ["channel", "outcome"], registry=r
        )
        self._turn_seconds = Histogram(
            "membot_turn_duration_seconds",
            "Wall time of a turn, from taking the messages to the reply.",
            ["channel"],
            buckets=TURN_BUCKETS,
            registry=r,
        )
        self._tool_calls = Counter(
            "membot_tool_calls", "Tool calls by tool and outcome.", ["tool", "outcome"], registry=r
        )
        self._compactions = Counter(
            "membot_compactions", "Context compactions; result is ok or fallback.", ["result"], registry=r
        )
        self._consolidations = Counter(
            "membot_consolidations",
            "Memory consolidations; result is ok or fallback (raw history entry written).",
            ["result"],
            registry=r,
        )
        self._live = _LiveCollector()
        r.register(self._live)

    # -- recording calls ----------------------------------------------------------------------------

    def turn_finished(self, channel: str, outcome: str, seconds: float) -> None:
        """``TurnObserver``: outcome is ok, error, timeout, stopped or waiting (for the model)."""
        self._turns.labels(channel, outcome).inc()
        self._turn_seconds.labels(channel).observe(max(0.0, seconds))

    def tool_call(self, name: str, outcome: str) -> None:
        """``ToolObserver``: outcome is ok, error, timeout, bad_arguments, unknown, repeated, ..."""
        self._tool_calls.labels(name, outcome).inc()

    def compaction(self, *, fallback: bool) -> None:
        """One compaction; ``fallback`` when the summary call failed and a plain trim was used."""
        self._compactions.labels("fallback" if fallback else "ok").inc()

    def consolidation(self, *, fallback: bool) -> None:
        """One memory consolidation; ``fallback`` when the raw-history entry replaced the LLM summary."""
        self._consolidations.labels("fallback" if fallback else "ok").inc()

    # -- scrape-time sources ------------------------------------------------------------------------

    def watch(
        self,
        *,
        llm_stats: StatsSource | None = None,
        queued: IntSource | None = None,
        running_turns: IntSource | None = None,
        active_sessions: IntSource | None = None,
        kept_answers: IntSource | None = None,
    ) -> None:
        """Name the callables read at every scrape (replacing earlier ones). Unset sources export nothing."""
        if llm_stats is not None:
            self._live.llm_stats = llm_stats
        if queued is not None:
            self._live.queued = queued
        if running_turns is not None:
            self._live.running_turns = running_turns
        if active_sessions is not None:
            self._live.active_sessions = active_sessions
        if kept_answers is not None:
            self._live.kept_answers = kept_answers

    def render(self) -> bytes:
        """The registry in the Prometheus text format (served with :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


class _LiveCollector(Collector):
    """Exports numbers kept elsewhere, read when Prometheus scrapes (never stale, no double book-keeping)."""

    def __init__(self) -> None:
        self.llm_stats: StatsSource | None = None
        self.queued: IntSource | None = None
        self.running_turns: IntSource | None = None
        self.active_sessions: IntSource | None = None
        self.kept_answers: IntSource | None = None

    def describe(self) -> list[Metric]:
        # Describing nothing keeps the registry from calling collect() (and the sources) at registration.
        return []

    def collect(self) -> Iterator[Metric]:
        yield from _gauge("membot_queue_depth", "Messages waiting for a turn, all sessions.", self.queued)
        yield from _gauge("membot_running_turns", "Turns running right now.", self.running_turns)
        yield from _gauge(
            "membot_active_sessions", "Sessions held in memory (recently active).", self.active_sessions
        )
        yield from _gauge(
            "membot_kept_answers",
            "Answers a platform refused, kept in the inbox to be tried again (see /healthz per chat).",
            self.kept_answers,
        )
        stats = self.llm_stats() if self.llm_stats is not None else None
        if stats is not None:
            yield from _llm_families(stats)


def _gauge(name: str, documentation: str, source: IntSource | None) -> Iterator[Metric]:
    if source is not None:
        yield GaugeMetricFamily(name, documentation, value=source())


def _llm_families(stats: LLMStats) -> Iterator[Metric]:
    calls = CounterMetricFamily("membot_llm_calls", "Successful LLM calls by model.", labels=["model"])
    tokens = CounterMetricFamily(
        "membot_llm_tokens", "LLM tokens by model and kind (input, output, cached).", labels=["model", "kind"]
    )
    cost = CounterMetricFamily("membot_llm_cost_usd", "Estimated LLM cost in USD by model.", labels=["model"])
    for model, usage in sorted(stats.by_model.items()):
        calls.add_metric([model], usage.calls)
        tokens.add_metric([model, "input"], usage.input_tokens)
        tokens.add_metric([model, "output"], usage.output_tokens)
        tokens.add_metric([model, "cached"], usage.cached_tokens)
        cost.add_metric([model], usage.cost_usd)
    yield calls
    yield tokens
    yield cost
    yield CounterMetricFamily(
        "membot_llm_failures", "Failed LLM attempts (each retry counts).", value=stats.failures
    )
    by_model = CounterMetricFamily(
        "membot_llm_model_failures",
        "Failed LLM attempts by model and reason (timeout, rate_limited, auth, unavailable, ...).",
        labels=["model", "reason"],
    )
    for (model, reason), count in sorted(stats.failures_by.items()):
        by_model.add_metric([model, reason], count)
    yield by_model
    yield CounterMetricFamily(
        "membot_llm_retries", "LLM attempts retried after backoff.", value=stats.retries
    )
    yield CounterMetricFamily(
        "membot_llm_failovers", "Switches to the next model of the failover chain.", value=stats.failovers
    )
    skipped = GaugeMetricFamily(
        "membot_llm_model_skipped",
        "1 for each model the circuit breaker skips now (failing with an outage: asked after the others).",
        labels=["model"],
    )
    for model in sorted(stats.skipped):  # a model that is back has no sample, as /healthz lists none
        skipped.add_metric([model], 1)
    yield skipped
    if stats.last_ok is not None:  # no call yet: unknown, so no sample rather than a false 0
        yield GaugeMetricFamily(
            "membot_llm_last_call_ok", "1 if the last LLM call succeeded, else 0.", value=int(stats.last_ok)
        )
