"""A chat's messages are never dated before the ones already in it, whatever the machine's clock does.

The clock steps back at times (a Raspberry Pi that starts before NTP, an NTP correction, a VM restored
from a snapshot): a message it dated came before earlier ones of the same chat, its turn and answer
too, and memory took the older statement for the current one. A step back of more than
``intake.HOLD_LIMIT`` is a clock that was wrong ahead: its dates are not held, and the log says so. A clock
more than that behind a platform's date (a board booted at 1970 before NTP) gives way to the platform's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from structlog.testing import capture_logs

from bot import intake
from bot.domain import InboundMessage, Message, Role
from pipeline import Turn
from tests.bot.test_dispatcher import build

NOON = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


class Clock:
    """The machine's clock, as the test sets it."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class Answering:
    """The model's step: answers each turn and records the turn's time."""

    name, order, enabled = "model", 30, True

    def __init__(self) -> None:
        self.times: list[datetime] = []

    def should_process(self, turn: Turn) -> bool:
        return True

    async def process(self, turn: Turn) -> None:
        self.times.append(turn.now)
        turn.add_message(Message(Role.ASSISTANT, f"answer to {turn.user_text}"))
        turn.reply = f"answer to {turn.user_text}"


def said(text: str, at: datetime, *, platform: bool = False) -> InboundMessage:
    """A message dated ``at``: by its platform (whose servers keep time) with ``platform``, else by our
    own clock when it came (as the terminal's are)."""
    return InboundMessage("test", "c1", "u1", text, timestamp=at, platform_date=platform)


async def chat_after_a_step_back(tmp_path: Path, step: timedelta) -> tuple[list[Message], list[datetime]]:
    """One message at noon, then the clock steps back by ``step`` and another comes a minute later."""
    clock, model = Clock(NOON), Answering()
    dispatcher, channel, sessions = build(tmp_path, model, clock=clock)
    await dispatcher.submit(said("I live in Lisbon.", NOON))
    await channel.wait_for(1)
    clock.now = NOON - step + timedelta(minutes=1)
    await dispatcher.submit(said("I moved to Berlin.", NOON + timedelta(minutes=1)))
    await channel.wait_for(2)
    session = await sessions.get("test:c1")
    await dispatcher.close(0)
    assert session is not None
    return session.messages, model.times


async def test_after_the_clock_steps_back_a_message_its_turn_and_answer_come_after_the_earlier_ones(
    tmp_path: Path,
) -> None:
    messages, turns = await chat_after_a_step_back(tmp_path, timedelta(minutes=10))

    assert [m.content for m in messages] == [
        "I live in Lisbon.",
        "answer to I live in Lisbon.",
        "I moved to Berlin.",
        "answer to I moved to Berlin.",
    ]
    dates = [m.timestamp for m in messages]
    assert dates == sorted(dates) and dates[2] > dates[1], dates
    assert turns[1] >= dates[2]  # the turn is not dated before its message


async def test_a_clock_that_was_wrong_ahead_by_days_is_taken_once_corrected_and_the_step_logged(
    tmp_path: Path,
) -> None:
    """Held, every date of the chat would stick at the wrong one until the clock caught up, days on."""
    step = intake.HOLD_LIMIT + timedelta(hours=1)
    with capture_logs() as logs:
        messages, turns = await chat_after_a_step_back(tmp_path, step)

    corrected = NOON - step + timedelta(minutes=1)
    assert messages[2].timestamp == corrected and turns[1] == corrected
    assert messages[3].timestamp >= corrected  # the answer still comes after its question
    [went_back] = [e for e in logs if e["event"] == "clock_went_back"]
    assert went_back["clock"] == corrected.isoformat()
    assert went_back["last_message"] == messages[1].timestamp.isoformat()


async def test_a_platform_date_ahead_of_the_clock_is_still_capped(tmp_path: Path) -> None:
    clock, model = Clock(NOON), Answering()
    dispatcher, channel, sessions = build(tmp_path, model, clock=clock)
    with capture_logs() as logs:
        await dispatcher.submit(said("hello", NOON + timedelta(minutes=2)))  # a skewed sender: said nothing
        await channel.wait_for(1)
        await dispatcher.submit(said("again", NOON + timedelta(hours=3)))  # our clock is behind: said
        await channel.wait_for(2)
    session = await sessions.get("test:c1")
    await dispatcher.close(0)

    assert session is not None and session.messages[0].timestamp == NOON and model.times[0] == NOON
    assert session.messages[2].timestamp > NOON  # capped at our clock, after the first answer
    [behind] = [e for e in logs if e["event"] == "clock_behind_platform"]
    assert behind["platform_date"] == (NOON + timedelta(hours=3)).isoformat() and "NTP" in behind["fix"]


async def test_a_clock_days_behind_the_platform_gives_way_to_the_platforms_date(tmp_path: Path) -> None:
    """A board that booted at 1970 before NTP: the chat's messages, their turns and answers went to 1970
    (and memory with them), with a warning only. The platform's date stands in, never backwards."""
    clock, model = Clock(NOON), Answering()
    dispatcher, channel, sessions = build(tmp_path, model, clock=clock)
    await dispatcher.submit(said("I live in Lisbon.", NOON, platform=True))
    await channel.wait_for(1)
    clock.now = datetime(1970, 1, 1, 0, 0, 5, tzinfo=UTC)
    moved = NOON + timedelta(minutes=1)
    with capture_logs() as logs:
        await dispatcher.submit(said("I moved to Berlin.", moved, platform=True))
        await channel.wait_for(2)
        await dispatcher.submit(said("late", NOON + timedelta(seconds=30), platform=True))  # dated earlier
        await channel.wait_for(3)
    session = await sessions.get("test:c1")
    await dispatcher.close(0)

    assert session is not None
    dates = [m.timestamp for m in session.messages]
    assert dates[2] == moved and model.times[1] == moved and dates[3] >= moved
    assert dates == sorted(dates) and dates[4] > dates[3]  # never before the last one
    assert {e["dated_by"] for e in logs if e["event"] == "clock_behind_platform"} == {"the platform's date"}
    assert not [e for e in logs if e["event"] == "clock_went_back"]
