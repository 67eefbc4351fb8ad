"""Pipeline: ordering, duplicate orders, failure isolation."""

from __future__ import annotations

import asyncio

import pytest

from bot.domain import InboundMessage, Session
from pipeline import Pipeline, System, Turn


class Step:
    def __init__(
        self, name: str, order: int, log: list[str], *, fail: bool = False, enabled: bool = True
    ) -> None:
        self.name, self.order, self.enabled = name, order, enabled
        self._log, self._fail = log, fail

    def should_process(self, turn: Turn) -> bool:
        return True

    async def process(self, turn: Turn) -> None:
        self._log.append(self.name)
        if self._fail:
            raise ValueError(f"{self.name} broke")


def turn() -> Turn:
    return Turn(Session.new("cli", "me"), (InboundMessage("cli", "me", "me", "hi"),))


async def test_runs_in_order_and_skips_disabled() -> None:
    log: list[str] = []
    steps = [
        Step("persist", 50, log),
        Step("compact", 18, log),
        Step("off", 40, log, enabled=False),
        Step("context", 20, log),
        Step("loop", 30, log),
    ]
    assert all(isinstance(s, System) for s in steps)
    await Pipeline(steps).run(turn())
    assert log == ["compact", "context", "loop", "persist"]


def test_duplicate_order_is_rejected_at_build_time() -> None:
    with pytest.raises(ValueError, match="share order 20"):
        Pipeline([Step("a", 20, []), Step("b", 20, [])])


async def test_failure_is_recorded_and_later_systems_still_run() -> None:
    log: list[str] = []
    t = await Pipeline([Step("bad", 18, log, fail=True), Step("good", 30, log)]).run(turn())
    assert log == ["bad", "good"]
    assert [f.system for f in t.failures] == ["bad"] and "bad broke" in t.failures[0].error


class Hang(Step):
    async def process(self, turn: Turn) -> None:
        self._log.append(self.name)
        await asyncio.Event().wait()


class Always(Step):
    always = True

    async def process(self, turn: Turn) -> None:
        self._log.append(f"{self.name} stopped={turn.stopped}")


async def test_a_cancelled_turn_still_runs_the_systems_marked_always() -> None:
    log: list[str] = []
    steps = [Hang("loop", 30, log), Step("persist", 50, log), Always("usage", 90, log)]
    t = turn()
    task = asyncio.create_task(Pipeline(steps).run(t))
    while log != ["loop"]:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["loop", "usage stopped=True"]  # persist skipped: there is no answer to keep
    assert t.stopped


async def test_a_timeout_runs_them_too_and_stays_a_timeout() -> None:
    log: list[str] = []
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await Pipeline([Hang("loop", 30, log), Always("usage", 90, log)]).run(turn())
    assert log == ["loop", "usage stopped=True"]
