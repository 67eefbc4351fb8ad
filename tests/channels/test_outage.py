"""StorageOutage: bounded exponential backoff, one log line when an outage starts and one when it ends."""

from __future__ import annotations

import errno

import pytest

from bot.errors import StorageError
from bot.ports import ChannelHealth
from channels.outage import StorageOutage, is_storage_error


def events(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.msg["event"], r.msg["level"]) for r in caplog.records if isinstance(r.msg, dict)]


def test_the_delay_doubles_and_stays_within_its_bound() -> None:
    outage = StorageOutage("x", first_delay=0.5, max_delay=30.0)
    assert [outage.delay(n) for n in range(1, 10)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    outage = StorageOutage("the journal", clock=lambda: now[0])
    outage.recovered()  # nothing to report
    full = OSError(errno.ENOSPC, "No space left on device", "/ws/state/x.json")
    for _ in range(5):
        outage.failed(full)
        now[0] += 2
    outage.recovered()
    outage.recovered()
    assert events(caplog) == [
        ("storage_unavailable", "error"),
        *[("storage_still_unavailable", "debug")] * 4,
        ("storage_recovered", "info"),
    ]
    start, end = caplog.records[0].msg, caplog.records[-1].msg
    assert isinstance(start, dict) and isinstance(end, dict)
    assert start["error"] == "OSError: No space left on device" and start["path"] == "/ws/state/x.json"
    assert "free disk space" in str(start["hint"])
    assert end["seconds"] == 10.0 and end["failed_tries"] == 5
    outage.failed(full)  # a new outage is reported again
    assert events(caplog)[-1] == ("storage_unavailable", "error")


def test_storage_errors_are_told_apart_from_bugs() -> None:
    assert is_storage_error(OSError(errno.ENOSPC, "full"))
    assert is_storage_error(NotADirectoryError(errno.ENOTDIR, "not a folder"))
    assert is_storage_error(StorageError("cannot write"))
    assert not is_storage_error(ValueError("bad data"))
    assert not is_storage_error(UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"))


def test_an_outage_several_writers_share_ends_when_the_last_one_failing_goes_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The Telegram intake's lanes and paste joiner share one outage: one chat's write that works must not
    clear /healthz while another's is still refused, and one that stopped trying holds it no longer."""
    health = ChannelHealth()
    outage = StorageOutage("taking messages in", health=health)
    full = OSError(errno.ENOSPC, "No space left on device")
    outage.failed(full, holder="a")
    outage.failed(full, holder="b")
    outage.failed(full, holder="c")
    outage.recovered(holder="a")
    outage.failed(full, holder="b")  # b's retry fails again
    assert "taking messages in" in health.storage_errors and outage.active
    outage.given_up(holder="c")  # cancelled: whether its write would go through is unknown
    assert "taking messages in" in health.storage_errors
    outage.recovered(holder="b")
    assert health.storage_errors == {} and not outage.active
    assert [event for event, _ in events(caplog)].count("storage_recovered") == 1


def test_the_health_check_clears_when_the_last_failing_writer_gives_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing waits for storage then: /healthz must not stay 503 until some later write happens to go
    through (in a quiet chat, never). The outage as logged lasts until one does; a write refused
    meanwhile names it in the health again, without logging a second start."""
    health = ChannelHealth()
    outage = StorageOutage("taking messages in", health=health)
    full = OSError(errno.ENOSPC, "No space left on device")
    outage.failed(full, holder="a")
    outage.failed(full, holder="b")
    outage.given_up(holder="a")
    assert "taking messages in" in health.storage_errors  # b still waits
    outage.given_up(holder="b")
    assert health.storage_errors == {}
    outage.given_up(holder="c")  # one that never failed changes nothing
    outage.failed(full, holder="d")
    assert "taking messages in" in health.storage_errors
    outage.recovered(holder="d")
    assert health.storage_errors == {} and not outage.active
    assert [event for event, _ in events(caplog)] == [
        "storage_unavailable",
        *["storage_still_unavailable"] * 2,
        "storage_recovered",
    ]
