"""bot.retry: the backoff arithmetic and the retry loop."""

from __future__ import annotations

import asyncio

import pytest

from bot.retry import Backoff, retry


def test_backoff_doubles_up_to_the_cap() -> None:
    backoff = Backoff(0.5, 3.0)
    assert [backoff(n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff(-1) == 0.5  # "before the first retry" is the first delay


def test_backoff_jitter_and_hint() -> None:
    backoff = Backoff(1.0, 5.0, jitter=lambda: 0.0)
    assert [backoff(n) for n in range(4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff(0, hint=2.5) == 2.5
    assert backoff(0, hint=60.0) == 5.0


class Flaky:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "ok"


async def test_retry_until_success_with_the_waits_in_between() -> None:
    slept: list[float] = []
    told: list[tuple[str, int, float]] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    call = Flaky([OSError("a"), OSError("b")])
    result = await retry(
        call,
        retry_if=lambda exc, tries: isinstance(exc, OSError),
        wait=lambda exc, tries: Backoff(1.0, 10.0)(tries - 1),
        on_retry=lambda exc, tries, delay: told.append((str(exc), tries, delay)),
        sleep=sleep,
    )
    assert result == "ok" and call.calls == 3
    assert slept == [1.0, 2.0]
    assert told == [("a", 1, 1.0), ("b", 2, 2.0)]


async def test_retry_raises_the_error_as_is_when_told_not_to_go_on() -> None:
    call = Flaky([OSError("a"), OSError("b"), OSError("c")])
    with pytest.raises(OSError, match="b"):
        await retry(call, retry_if=lambda exc, tries: tries < 2, wait=lambda exc, tries: 0.0)
    assert call.calls == 2

    call = Flaky([ValueError("bug")])
    with pytest.raises(ValueError):
        await retry(call, retry_if=lambda exc, tries: isinstance(exc, OSError), wait=lambda exc, tries: 0.0)
    assert call.calls == 1


async def test_cancellation_is_never_retried() -> None:
    async def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await retry(cancelled, retry_if=lambda exc, tries: True, wait=lambda exc, tries: 0.0)
