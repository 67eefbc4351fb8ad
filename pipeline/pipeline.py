"""Runs the systems of a turn in order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import structlog

from bot.domain import InboundMessage
from bot.errors import LLMContentFiltered
from pipeline.base import System, SystemFailure, Turn

log = structlog.get_logger(__name__)


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
        except Exception as exc:
            log.exception("system_failed", system=system.name)
            Pipeline._record(system, turn, exc)

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
