"""A paste full of dates (a log, a CSV, a schedule) is read in linear time.

Each date looked for the words announcing it ("on", "before the") from the start of the message, and
each new date was checked against every date found before it: both quadratic. 16,000 characters of
"on 1/2" (the longest message a chat takes in) held the event loop for five seconds, every chat with
it. The bound below is generous (the query takes well under a second here); before, it took minutes.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from bot.memory.timehints import periods, time_hint

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


async def test_a_paste_of_thousands_of_dates_is_read_in_linear_time() -> None:
    paste = "on 1/2 " * 12_000 + "".join(f"before May {d % 28 + 1} " for d in range(4_000))
    async with asyncio.timeout(20):
        hint = await asyncio.to_thread(time_hint, paste, NOW, ZoneInfo("UTC"))
    assert hint is not None and len(hint.spans) == 16_000


def test_the_words_announcing_a_date_are_still_found_just_before_it() -> None:
    found = periods("what did I do on the  1/2 or " + "x" * 80 + " 3/4?", NOW, ZoneInfo("UTC"))
    assert [(start.date().isoformat(), end.date().isoformat()) for start, end in found] == [
        ("2026-01-01", "2026-01-03")  # "on the 1/2" is January 2nd; "3/4" alone is a fraction
    ]
