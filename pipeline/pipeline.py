"""Runs the systems of a turn in order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import structlog

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

    async def run(self, turn: Turn) -> Turn:
        for system in self._systems:
            if not system.enabled or not system.should_process(turn):
                continue
            try:
                await system.process(turn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("system_failed", system=system.name)
                turn.failures.append(SystemFailure(system.name, f"{type(exc).__name__}: {exc}"))
        return turn
