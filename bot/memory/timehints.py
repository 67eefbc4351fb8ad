"""Time words in a query ("in March", "last May", "two weeks ago", "yesterday", "last Thursday") as a
preference for what was said then.

Memory knows when everything was said, and the query's own date is "now", so a question that names a
time can prefer what was said in that period. The hint only adds to a score; it never hides an item,
because people misremember dates: "two weeks ago" matches anything from one to three weeks back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import numpy as np
from numpy.typing import NDArray

MONTHS = {
    name: i
    for i, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        start=1,
    )
    for name in names
}
_MONTH_NAMES = "|".join(sorted(MONTHS, key=len, reverse=True))
# "in March", "early May": that month in any year (memory rarely spans several).
_MONTH = re.compile(r"\b(?:in|during|since|of|early|late|mid|this past)\s+(" + _MONTH_NAMES + r")\b", re.I)
# "last May": the most recent May before the current month.
_LAST_MONTH = re.compile(r"\blast\s+(" + _MONTH_NAMES + r")\b", re.I)
# "on May 3rd", "May 3", "3 May", "the 3rd of May": that day, a day either side.
_DAY = re.compile(
    r"\b(?:("
    + _MONTH_NAMES
    + r")\.?\s+(\d{1,2})(?:st|nd|rd|th)?|(\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?("
    + _MONTH_NAMES
    + r"))\b(?!\s*\d{3})",
    re.I,
)
_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "couple of": 2, "a couple of": 2,
    "few": 3, "a few": 3,
}  # fmt: skip
_UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}
# "two weeks ago", "a couple of months ago", "3 days ago".
_AGO = re.compile(
    r"\b(\d{1,3}|"
    + "|".join(sorted(_NUMBERS, key=len, reverse=True))
    + r")\s+(day|week|month|year)s?\s+ago\b",
    re.I,
)
_WINDOWS = (
    (re.compile(r"\b(today|this morning|tonight|earlier today)\b", re.I), 1),
    (re.compile(r"\byesterday\b", re.I), 2),
    (re.compile(r"\b(last|past|this) (few )?days?\b", re.I), 4),
    (re.compile(r"\b(last|past|this) week(end)?\b", re.I), 8),
    (re.compile(r"\b(last|past) (two|2|couple of) weeks\b", re.I), 15),
    (re.compile(r"\b(last|past|this) month\b", re.I), 32),
    (re.compile(r"\b(last|past) (few|two|three|couple of) months\b", re.I), 95),
)
_YEAR = re.compile(r"\b(last|this|past) year\b", re.I)
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
# "last Thursday": the most recent one before today; "on Monday": the most recent, today too. A bare
# name is often part of another ("Sunday mass", "Friday drinks"), so it names no day.
_WEEKDAY = re.compile(r"\b(?:(last|this past|past)|on)\s+(" + "|".join(WEEKDAYS) + r")\b", re.I)

# Any of the patterns above: a query it does not match names no time.
_NAMED = (_MONTH, _LAST_MONTH, _DAY, _AGO, *(pattern for pattern, _ in _WINDOWS), _YEAR, _WEEKDAY)
_ANY = re.compile("|".join(f"(?:{pattern.pattern})" for pattern in _NAMED), re.I)
Span = tuple[datetime, datetime]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


def microseconds(when: datetime) -> int:
    """``when`` as whole microseconds since 1970 (UTC): exact, so comparisons and differences in these
    agree with the datetimes'."""
    return (when - EPOCH) // MICROSECOND


@dataclass(frozen=True, slots=True)
class TimeHint:
    """ "Said in the period the query names": any of ``spans``, or in one of ``months`` (any year, in the
    user's time zone). Call it with one time, or :meth:`among` with many at once."""

    spans: tuple[Span, ...]
    months: frozenset[int]
    tz: ZoneInfo

    def __call__(self, when: datetime) -> bool:
        return (
            any(start <= when <= end for start, end in self.spans)
            or when.astimezone(self.tz).month in self.months
        )

    def among(self, times: Sequence[datetime], stamps: NDArray[np.int64]) -> NDArray[np.bool_]:
        """Which of ``times`` (``stamps``: the same, as :func:`microseconds`) fall in the period."""
        found = np.zeros(len(stamps), dtype=np.bool_)
        for start, end in self.spans:
            found |= (microseconds(start) <= stamps) & (stamps <= microseconds(end))
        if self.months:
            found |= np.array(
                [when.astimezone(self.tz).month in self.months for when in times], dtype=np.bool_
            )
        return found


def time_hint(query: str, now: datetime, tz: ZoneInfo) -> TimeHint | None:
    """What "said in the period the query names" means, or ``None`` when it names none."""
    if not _ANY.search(query):  # most queries name no time: one search instead of a dozen
        return None
    months = frozenset(MONTHS[m.group(1).lower()] for m in _MONTH.finditer(query))
    spans = periods(query, now, tz)
    if not months and not spans:
        return None
    return TimeHint(tuple(spans), months, tz)


def periods(query: str, now: datetime, tz: ZoneInfo) -> list[Span]:
    """The periods the query names, each as [start, end] (end never past ``now``); a month named
    without a year ("in March") is not one of them."""
    spans: list[Span] = []
    days = next((d for pattern, d in _WINDOWS if pattern.search(query)), None)
    if days is not None:
        spans.append((now - timedelta(days=days), now))
    for m in _AGO.finditer(query):
        count = m.group(1).lower()
        back = (int(count) if count.isdigit() else _NUMBERS[count]) * _UNIT_DAYS[m.group(2).lower()]
        slack = max(1.0, back / 2)  # "two weeks ago" is one to three weeks back
        spans.append((now - timedelta(days=back + slack), now - timedelta(days=max(0.0, back - slack))))
    local = now.astimezone(tz)
    for m in _LAST_MONTH.finditer(query):
        month = MONTHS[m.group(1).lower()]
        year = local.year if month < local.month else local.year - 1
        spans.append(_local_span(date(year, month, 1), _month_end(year, month), tz))
    for m in _DAY.finditer(query):
        month = MONTHS[(m.group(1) or m.group(4)).lower()]
        day = int(m.group(2) or m.group(3))
        year = local.year if (month, day) <= (local.month, local.day) else local.year - 1
        named = _latest(year, month, day)
        if named is None:  # "February 30": no such day
            continue
        spans.append(_local_span(named - timedelta(days=1), named + timedelta(days=1), tz))
    for m in _WEEKDAY.finditer(query):
        back = (local.weekday() - WEEKDAYS.index(m.group(2).lower())) % 7
        if m.group(1) and back == 0:
            back = 7
        named = local.date() - timedelta(days=back)
        spans.append(_local_span(named, named, tz))
    for m in _YEAR.finditer(query):
        year = local.year - 1 if m.group(1).lower() == "last" else local.year
        if m.group(1).lower() == "past":
            spans.append((now - timedelta(days=366), now))
        else:
            spans.append(_local_span(date(year, 1, 1), date(year, 12, 31), tz))
    return spans


def _latest(year: int, month: int, day: int) -> date | None:
    """That day in ``year`` or, when the year has none ("February 29th" in 2025), the last year before
    that has one (2024); ``None`` when no year has it. Eight years cover leap years skipped at a century.
    """
    for back in range(9):
        try:
            return date(year - back, month, day)
        except ValueError:
            continue
    return None


def _month_end(year: int, month: int) -> date:
    return (date(year + month // 12, month % 12 + 1, 1)) - timedelta(days=1)


def _local_span(first: date, last: date, tz: ZoneInfo) -> Span:
    """From the start of ``first`` to the end of ``last`` in the user's time zone.

    Both are UTC instants, and the end is the next day's start less a microsecond counted in UTC:
    arithmetic on a zoned datetime is wall-clock arithmetic, and where clocks go back at midnight
    (America/Santiago) "23:59:59.999999" names the first of the day's two last hours, so the second
    one was left out of the day."""
    after = last + timedelta(days=1)
    start = datetime(first.year, first.month, first.day, tzinfo=tz).astimezone(UTC)
    end = datetime(after.year, after.month, after.day, tzinfo=tz).astimezone(UTC) - timedelta(microseconds=1)
    return start, end
