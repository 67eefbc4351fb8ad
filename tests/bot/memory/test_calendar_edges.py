"""A message naming a date at the calendar's edge ("valid until 9999-12-31", a log's "0001-01-01") keeps
its memory: the time words name no period, and the turn's prompt still holds MEMORY.md and the notes.

Before, a day either side of such a date overflowed ``datetime``: the context system failed, and the
turn was answered with the base prompt alone (no MEMORY.md, no notes, no recall) and an error logged.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from bot.memory.timehints import periods, time_hint
from tests.bot.memory.test_end_to_end import chat

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
EDGES = [
    "on 9999-12-31",
    "after 12/31/9999",
    "on 31.12.9999",
    "since 0001-01-01",
    "before 1/1/0001",
    "on December 31, 9999",
    "in December 9999",
    "since January 0001",
]


@pytest.mark.parametrize("zone", ["UTC", "Pacific/Kiritimati", "Pacific/Pago_Pago"])
@pytest.mark.parametrize("query", EDGES)
def test_a_date_at_the_calendars_edge_names_no_period(query: str, zone: str) -> None:
    assert periods(query, NOW, ZoneInfo(zone)) == []
    assert time_hint(query, NOW, ZoneInfo(zone)) is None


def test_the_years_next_to_the_edge_still_name_their_day() -> None:
    found = periods("what happened on 9998-12-31?", NOW, ZoneInfo("UTC"))
    assert [(start.date().isoformat(), end.date().isoformat()) for start, end in found] == [
        ("9998-12-30", "9999-01-01")
    ]


async def test_a_turn_naming_an_edge_date_still_gets_its_memory(tmp_path: Path) -> None:
    memory = tmp_path / "ws" / "memory"
    memory.mkdir(parents=True)
    (memory / "MEMORY.md").write_text("# Facts\n- The user's cat is called Miso.\n")
    async with chat(tmp_path, memory={"embeddings": "none"}) as bot:
        for text in ("My licence is valid until 9999-12-31.", "The log says 0001-01-01."):
            assert await bot.say(text, NOW) == f"echo: {text}"
            assert "The user's cat is called Miso." in bot.system_prompt(), text
