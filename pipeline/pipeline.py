"""Runs the systems of a turn in order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import structlog

from bot.domain import InboundMessage
from bot.errors import (
    LLMAuthError,
    LLMBadResponse,
    LLMContentFiltered,
    LLMContextOverflow,
    LLMError,
    LLMNotFound,
    LLMRateLimited,
    LLMTimeout,
    LLMUnavailable,
)
from pipeline.base import System, SystemFailure, Turn

log = structlog.get_logger(__name__)

# What an operator checks for each failure the LLM client classifies (after its retries and fallbacks).
_LLM_HINTS: dict[type[LLMError], str] = {
    LLMAuthError: "check llm.<provider>.api_key (MEMBOT_LLM__OPENAI__API_KEY...) and its access",
    LLMUnavailable: "the provider (llm.<provider>.base_url) is out of reach; see llm.fallback_models",
    LLMTimeout: "the model was slower than llm.timeout (first_byte_timeout, idle_timeout when streamed)",
    LLMRateLimited: "the provider's rate limit held past the retries; lower the load or raise the limit",
    LLMContextOverflow: "the prompt is over the model's window; check max_input_tokens in the models file",
    LLMBadResponse: "the server's answer was not one membot can read; check llm.provider and its base_url",
    LLMNotFound: "the server knows no such model or path: check llm.model (and fallback_models) and base_url",
}


def _hint(exc: LLMError) -> str:
    # A 4xx the server answered (an unknown model, a request it refused) is no answer membot misread:
    # the error itself names the settings to check ("does not know model … check MEMBOT_LLM__MODEL").
    if type(exc) is LLMBadResponse and 400 <= (exc.status_code or 0) < 500:
        return f"the server refused the request (HTTP {exc.status_code}); check what the error names"
    return _LLM_HINTS.get(type(exc), "see the lines before this one for each try")


class Pipeline:
    """An ordered, fixed list of systems. Sorted once here; ``run`` is then a plain loop.

    The composition root (bot/app.py) decides which systems exist; systems never register themselves.
    """

    def __init__(self, systems: Iterable[System]) -> None:
        ordered = sorted(systems, key=lambda s: s.order)
        seen: dict[int, str] = {}
        for system in ordered:
            if system.order in seen:
                raise ValueError(
                    f"pipeline systems {seen[system.order]!r} and {system.name!r} share order {system.order}"
                )
            seen[system.order] = system.name
        self._systems = tuple(ordered)

    @property
    def systems(self) -> tuple[System, ...]:
        return self._systems

    def anticipate(self, message: InboundMessage) -> None:
        """Let the systems that can start early on ``message`` do so (see ``System``); never raises:
        a head start that fails costs nothing but the head start."""
        for system in self._systems:
            anticipate = getattr(system, "anticipate", None)
            if anticipate is None or not system.enabled:
                continue
            try:
                anticipate(message)
            except Exception:
                log.exception("system_anticipate_failed", system=system.name)

    async def run(self, turn: Turn) -> Turn:
        """Run every system in order. When the turn is stopped or times out (cancelled), the systems
        not yet run that are marked ``always = True`` still run, shielded, before the cancellation goes
        on: the model calls already made were paid for and must be accounted."""
        remaining = list(self._systems)
        try:
            while remaining:
                await self._step(remaining.pop(0), turn)
        except asyncio.CancelledError:
            turn.stopped = True
            finishers = [s for s in remaining if getattr(s, "always", False)]
            if finishers:
                await asyncio.shield(self._finish(finishers, turn))
            raise
        return turn

    async def _finish(self, systems: list[System], turn: Turn) -> None:
        for system in systems:
            await self._step(system, turn)

    @staticmethod
    async def _step(system: System, turn: Turn) -> None:
        if not system.enabled or not system.should_process(turn):
            return
        try:
            await system.process(turn)
        except asyncio.CancelledError:
            raise
        except LLMContentFiltered as exc:  # expected and classified: the provider declined, no bug
            log.warning("llm_content_filtered", system=system.name, model=exc.model, error=str(exc))
            Pipeline._record(system, turn, exc)
        except LLMError as exc:  # classified by the client after its retries: an outage, not a bug here
            Pipeline._log_llm_failure(system, exc)
            Pipeline._record(system, turn, exc)
        except Exception as exc:
            log.exception("system_failed", system=system.name)
            Pipeline._record(system, turn, exc)

    @staticmethod
    def _log_llm_failure(system: System, exc: LLMError) -> None:
        """One line the operator can act on, without a traceback (that points into the client, not at a
        cause): an error when only the operator can fix it (a refused key), a warning otherwise."""
        level = log.warning if exc.retryable else log.error
        level(
            "llm_failed",
            system=system.name,
            model=exc.model,
            status=exc.status_code,
            kind=type(exc).__name__,
            error=str(exc),
            hint=_hint(exc),
        )

    @staticmethod
    def _record(system: System, turn: Turn, exc: Exception) -> None:
        """The failure on the turn: the dispatcher tells the chat in plain words chosen by its type."""
        hint = getattr(exc, "retry_after", None)
        turn.failures.append(
            SystemFailure(
                system.name,
                f"{type(exc).__name__}: {exc}",
                type(exc),
                retry_after=float(hint) if isinstance(hint, int | float) and hint > 0 else None,
            )
        )
