"""Before, after or since a date or an event: open periods, numeric dates, and events found in memory."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from bot.memory.anchors import Anchor, anchor_of
from bot.memory.item_store import ItemStore
from bot.memory.items import MemoryItem
from bot.memory.retrieval import Retriever
from bot.memory.timehints import EPOCH, TimeHint, periods, time_hint
from tests.bot.memory.conftest import said_before

NOW = datetime(2023, 12, 6, 11, 18, tzinfo=UTC)  # a Wednesday
UTCZ = ZoneInfo("UTC")


def days(query: str) -> list[tuple[date, date]]:
    return [(start.date(), end.date()) for start, end in periods(query, NOW, UTCZ)]


def test_before_after_and_since_a_date_are_open_periods() -> None:
    before = periods("what did I cook before May 3rd?", NOW, UTCZ)
    assert before == [(EPOCH, datetime(2023, 5, 3, tzinfo=UTC) - timedelta(microseconds=1))]
    assert periods("after March", NOW, UTCZ) == [(datetime(2023, 4, 1, tzinfo=UTC), NOW)]  # from its end
    assert periods("since March", NOW, UTCZ) == [(datetime(2023, 3, 1, tzinfo=UTC), NOW)]  # from its start
    assert days("how many bass did I catch before the 7/22 trip?") == [(EPOCH.date(), date(2023, 7, 21))]
    assert days("since last May") == [(date(2023, 5, 1), NOW.date())]
    assert days("prior to last May") == [(EPOCH.date(), date(2023, 4, 30))]
    assert days("since Dec 6th") == [(NOW.date(), NOW.date())]  # today: from its start
    assert days("after Dec 6th") == []  # not over yet: nothing is after it
    assert days("on May 3rd") == [(date(2023, 5, 2), date(2023, 5, 4))]  # no side word: the day itself
    hint = time_hint("what did I buy before June?", NOW, UTCZ)
    assert (
        hint is not None
        and hint(datetime(2022, 1, 1, tzinfo=UTC))
        and not hint(datetime(2023, 6, 2, tzinfo=UTC))
    )


@pytest.mark.parametrize(
    ("query", "day"),
    [
        ("what did I do on 7/22?", date(2023, 7, 22)),  # month first, as in the US
        ("07/22/2023", date(2023, 7, 22)),
        ("7/22/23", date(2023, 7, 22)),
        ("12/25", date(2022, 12, 25)),  # the latest one not after today
        ("2023-07-22", date(2023, 7, 22)),
        ("2023/7/2", date(2023, 7, 2)),
        ("22/7/2023", date(2023, 7, 22)),  # 22 can be no month: day first
        ("22.7.2023", date(2023, 7, 22)),  # dotted: day first
        ("what happened on 22.7.?", date(2023, 7, 22)),
        ("on 3/4", date(2023, 3, 4)),  # a fraction's form, but "on" says a date comes
    ],
)
def test_numeric_dates_name_their_day(query: str, day: date) -> None:
    assert days(query) == [(day - timedelta(days=1), day + timedelta(days=1))]


@pytest.mark.parametrize(
    "query",
    [
        "add 1/2 cup of sugar",
        "the shop is open 24/7",
        "I ate 3/4 of it",
        "I rated it 8/10",
        "10/10 would go again",
        "it got 5/5 stars",
        "a 1/72 scale bomber",
        "pi is about 22/7",
        "after 3/4 of the season",
        "the score was 22.7.",
        "version 1.2.3",
        "on 2023-13-01",  # no thirteenth month
        "on 2/30",  # no such day
    ],
)
def test_fractions_scores_and_decimals_are_no_dates(query: str) -> None:
    assert time_hint(query, NOW, UTCZ) is None, query


def test_an_event_is_the_clause_after_before_after_or_since() -> None:
    assert anchor_of("What did I invest in before getting the Air Fryer?") == Anchor(
        "getting the Air Fryer", False
    )
    assert anchor_of("How many weeks since I recovered from the flu when I jogged?") == Anchor(
        "I recovered from the flu", True
    )
    assert anchor_of("What did I buy after I started my current job, and why?") == Anchor(
        "I started my current job", True
    )
    for no_event in (
        "as I said before",
        "I'll know before long",
        "and ever since",
        "since then, what changed?",
        "after all, who cares",
        "what did I do since last week?",  # a time: periods(), not an event
        "how many bass before the 7/22 trip?",
        "what did I eat before May 3rd?",
    ):
        assert anchor_of(no_event) is None, no_event


def said(content: str, days_ago: float, *, tags: tuple[str, ...] = ("user",), ref: str = "") -> MemoryItem:
    return said_before(NOW, content, days_ago=days_ago, tags=tags, ref=ref)


async def retriever_over(tmp_path: Path, items: list[MemoryItem]) -> Retriever:
    store = ItemStore(tmp_path / "items")
    await store.load()
    retriever = Retriever(store)
    await store.add_many(items)
    await retriever.ready()
    return retriever


async def test_before_or_after_an_event_lifts_what_was_said_on_that_side(tmp_path: Path) -> None:
    pot = said("I bought an Instant Pot for the kitchen", 40)
    fryer = said("I got the Air Fryer yesterday", 20)
    # The same talk, minutes later, in fewer words: the best match, so the event's time.
    again = said("I got the Air Fryer", 20 - 0.003)
    between = said("I bought a waffle maker for the kitchen", 20 - 0.001)  # in that talk: on no side
    mixer = said("I bought a stand mixer for the kitchen", 5)
    retriever = await retriever_over(tmp_path, [pot, fryer, between, again, mixer])

    def order(query: str) -> list[str]:
        return [s.item.id for s in retriever.rank(query, NOW, tz=UTCZ) if s.item.id in (pot.id, mixer.id)]

    # Without a side, the newer of two equal matches leads.
    assert order("What did I buy for the kitchen?") == [mixer.id, pot.id]
    assert order("What did I buy for the kitchen before getting the Air Fryer?") == [pot.id, mixer.id]
    assert order("What did I buy for the kitchen after getting the Air Fryer?") == [mixer.id, pot.id]
    before = retriever.rank("What did I buy for the kitchen before getting the Air Fryer?", NOW, tz=UTCZ)
    # The event itself keeps its place (the answer needs it): its telling is on that side too.
    ids = [s.item.id for s in before]
    assert set(ids[:2]) == {fryer.id, again.id}
    hint = retriever.match_words("before getting the Air Fryer", NOW, tz=UTCZ).around_event
    assert hint is not None and hint(pot.created_at) and not hint(mixer.created_at)
    assert hint(again.created_at) and hint(fryer.created_at) and not hint(between.created_at)
    after = retriever.match_words("after getting the Air Fryer", NOW, tz=UTCZ).around_event
    assert (
        after is not None and after(mixer.created_at) and after(again.created_at) and after(fryer.created_at)
    )
    assert not after(between.created_at) and not after(pot.created_at)


async def test_an_event_whose_time_memory_does_not_clearly_tell_names_no_period(tmp_path: Path) -> None:
    trips = [
        said("We came back from the Lisbon trip", 90, ref="t1"),
        said("Back home from the Lisbon trip, tired", 10),
    ]
    asked = said("How was the Lisbon trip with your sister and the kids?", 30, tags=("user", "question"))
    other = said("I bought new hiking boots", 50)
    retriever = await retriever_over(tmp_path, [*trips, asked, other])

    def period(query: str) -> TimeHint | None:
        return retriever.match_words(query, NOW, tz=UTCZ).around_event

    assert period("what did I buy since the Lisbon trip?") is None  # two trips, weeks apart: which one?
    assert period("what did I buy since I got my hiking boots?") is not None
    assert period("what did I buy since the volcano eruption?") is None  # nothing in memory tells of it
    # Among what a chat may see: the other trip is not there, and a question tells of no event.
    last = retriever.match_words(
        "what did I buy since the Lisbon trip?", NOW, tz=UTCZ, visible=lambda item: item.id != trips[0].id
    ).around_event
    assert last is not None and last(NOW) and not last(NOW - timedelta(days=11))
    unseen = {trip.id for trip in trips}
    asked_only = retriever.match_words(
        "what did I buy since the Lisbon trip?", NOW, tz=UTCZ, visible=lambda item: item.id not in unseen
    ).around_event
    assert asked_only is None
