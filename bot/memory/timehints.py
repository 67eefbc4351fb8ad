"""Time words in a query ("in March", "last May", "two weeks ago", "yesterday", "last Thursday",
"on 7/22", "before May 3rd", "since March") as a preference for what was said then.

Memory knows when everything was said, and the query's own date is "now", so a question that names a
time can prefer what was said in that period. The hint only adds to a score; it never hides an item,
because people misremember dates: "two weeks ago" matches anything from one to three weeks back.

"Before"/"after"/"since" a date is an open period ("before May 3rd": everything up to that day). Before
or after an event that is not a date ("before getting the air fryer") is no time word: the event and
when it happened are found by bot/memory/anchors.py (:func:`~bot.memory.anchors.anchor_of`).
"""

from __future__ import annotations

import bisect
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
# A year after a month or a day ("March 2024", "May 3rd, 2023"): that one, not the latest.
_YEAR_AFTER = r"(?:(?:,\s*|\s+)(\d{4})\b)?"
# "in March", "early May": that month in any year (memory rarely spans several); "in March 2024": that one.
_MONTH = re.compile(
    r"\b(?:in|during|of|early|late|mid|this past)\s+(" + _MONTH_NAMES + r")\b" + _YEAR_AFTER, re.I
)
# "last May": the most recent May before the current month.
_LAST_MONTH = re.compile(r"\blast\s+(" + _MONTH_NAMES + r")\b", re.I)
# "on May 3rd", "May 3", "3 May", "the 3rd of May": that day, a day either side; "May 3rd, 2023", "3 May
# 2023": that year's. Another number after it ("May 3 123") names no day.
_DAY = re.compile(
    r"\b(?:("
    + _MONTH_NAMES
    + r")\.?\s+(\d{1,2})(?:st|nd|rd|th)?|(\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?("
    + _MONTH_NAMES
    + r"))(?:(?:,\s*|\s+)(\d{4})\b|\b(?!\s*\d{3}))",
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

# Numeric dates. ISO ("2023-07-22", "2023/07/22") always. A slashed date is month first, as in the US
# ("7/22", "07/22/2023"), where most chat apps' English users write it; a first number over 12 can only be
# a day ("22/7/2023"). A dotted one is day first ("22.7.2023"). Without a year a slashed pair is often no
# date at all ("1/2 cup", "8/10", "24/7"), a dotted one a decimal ("22.7."), so those name a day only
# when they cannot be a fraction or a score (see _numeric_days), or when a word says a date comes
# ("on 22/7", "before 3.5.").
_ISO = re.compile(r"(?<![\w/.:-])(\d{4})[-/](\d{1,2})[-/](\d{1,2})(?![\w/-]|[.,]\d)")
_SLASHED = re.compile(r"(?<![\w/.:-])(\d{1,2})/(\d{1,2})(?:/(\d{4}|\d{2}))?(?![\w/]|[.,]\d)")
_DOTTED = re.compile(r"(?<![\w/.:-])(\d{1,2})\.(\d{1,2})\.(\d{4})?(?![\w/]|[.,]?\d)")
_DATE_WORD = re.compile(r"\b(?:on|before|after|since|until|till|prior to)\s+(?:the\s+)?$", re.I)
# What makes a slashed pair a quantity: a unit or "of" after it ("1/2 cup", "3/4 of the way").
_UNIT = re.compile(
    r"\s*(?:of\b|cups?\b|c\b|tsp\b|tbsp\b|teaspoons?\b|tablespoons?\b|inch|in\b|\"|miles?\b|mi\b|km\b|lbs?\b|"
    r"pounds?\b|oz\b|ounces?\b|stars?\b|points?\b|scale\b|time\b|split\b|rating\b)",
    re.I,
)
_DENOMINATORS = frozenset({2, 3, 4, 5, 6, 8, 10, 12, 16, 32, 64})
# "Before"/"after"/"since" a date: an open period, not the day itself. "Since March" is from March on.
_SIDE = r"\b(before|prior to|after|since)\s+(?:the\s+)?"
_SIDE_OF = re.compile(_SIDE + "$", re.I)
_SIDE_MONTH = re.compile(_SIDE + r"(" + _MONTH_NAMES + r")\b" + _YEAR_AFTER, re.I)

# Any of the word patterns above, or a digit, a separator and a digit: a query matching neither names
# no time. (The numeric patterns' look-behinds made one search of them all twice as slow.)
_NAMED = (
    _MONTH,
    _LAST_MONTH,
    _DAY,
    _AGO,
    *(pattern for pattern, _ in _WINDOWS),
    _YEAR,
    _WEEKDAY,
    _SIDE_MONTH,
)
_ANY = re.compile("|".join(f"(?:{pattern.pattern})" for pattern in _NAMED), re.I)
_NUMERIC = re.compile(r"\d[-/.]\d")


# How far before a date the words that announce it ("on the", "prior to") are looked for. Searching
# from the query's start instead made a paste of many dates quadratic: 16,000 characters of "on 1/2"
# (the longest message a chat takes in) held the event loop for five seconds.
_LEAD = 40


def _before(start: int) -> int:
    """Where to look for the words that lead up to a date found at ``start``."""
    return max(0, start - _LEAD)


def names_time(text: str) -> bool:
    """Whether ``text`` may name a time (one search or two instead of a dozen)."""
    return _ANY.search(text) is not None or _NUMERIC.search(text) is not None


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
    if not names_time(query):  # most queries name none
        return None
    months = frozenset(MONTHS[m.group(1).lower()] for m in _MONTH.finditer(query) if m.group(2) is None)
    spans = periods(query, now, tz)
    if not months and not spans:
        return None
    return TimeHint(tuple(spans), months, tz)


def periods(query: str, now: datetime, tz: ZoneInfo) -> list[Span]:
    """The periods the query names, each as [start, end] (end never past ``now``; "before May 3rd"
    starts at 1970); a month named without a year ("in March") is not one of them."""
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
    for mention in _dates(query, local.date()):
        side = _SIDE_OF.search(query, _before(mention.start), mention.start)
        if side is None:
            if mention.plain is not None:
                spans.append(_local_span(*mention.plain, tz))
            continue
        start, end = _local_span(mention.first, mention.last, tz)
        word = side.group(1).lower()
        if word in ("before", "prior to"):
            spans.append((EPOCH, start - MICROSECOND))
        elif word == "since":
            spans.append((start, now))
        elif end < now:  # "after May 3rd" asked on May 3rd names nothing yet
            spans.append((end + MICROSECOND, now))
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


@dataclass(frozen=True, slots=True)
class _Mention:
    """A date the query names: where (``start``, ``end`` in the query), the days it names (``first`` to
    ``last``), and the days it means on its own (``plain``: a day one either side, a whole month, or
    ``None`` for a bare month name, which names a period only after "before", "after" or "since")."""

    start: int
    end: int
    first: date
    last: date
    plain: tuple[date, date] | None


def _dates(query: str, today: date) -> list[_Mention]:
    """The dates ``query`` names, each once (a day's month is not a month of its own), in order.

    A date without a year is its latest one not after ``today``."""
    found: list[_Mention] = []
    taken: list[tuple[int, int]] = []  # where the dates found stand, in order; they never overlap

    def add(start: int, end: int, first: date, last: date, plain: tuple[date, date] | None) -> None:
        # Only the neighbours can overlap: a paste of thousands of dates stays linear.
        i = bisect.bisect_left(taken, (start, end))
        if (i > 0 and taken[i - 1][1] > start) or (i < len(taken) and taken[i][0] < end):
            return
        taken.insert(i, (start, end))
        found.append(_Mention(start, end, first, last, plain))

    def day(start: int, end: int, named: date | None) -> None:
        if named is not None:
            add(start, end, named, named, (named - timedelta(days=1), named + timedelta(days=1)))

    for start, end, named in _numeric_days(query, today):
        day(start, end, named)
    for m in _DAY.finditer(query):
        month = MONTHS[(m.group(1) or m.group(4)).lower()]
        number = int(m.group(2) or m.group(3))
        day(m.start(), m.end(), _named(month, number, m.group(5), today))  # None: "February 30", no such day
    for m in _MONTH.finditer(query):
        if m.group(2) is not None and (whole := _whole_month(int(m.group(2)), MONTHS[m.group(1).lower()])):
            add(m.start(1), m.end(), *whole, whole)
    for m in _LAST_MONTH.finditer(query):
        month = MONTHS[m.group(1).lower()]
        year = today.year if month < today.month else today.year - 1
        whole = (date(year, month, 1), _month_end(year, month))
        add(m.start(), m.end(), *whole, whole)
    for m in _SIDE_MONTH.finditer(query):
        month = MONTHS[m.group(2).lower()]
        year = today.year if month <= today.month else today.year - 1
        span = (
            _whole_month(int(m.group(3)), month)
            if m.group(3)
            else (date(year, month, 1), _month_end(year, month))
        )
        if span is not None:
            add(m.start(2), m.end(), *span, None)
    return sorted(found, key=lambda m: m.start)


def _numeric_days(query: str, today: date) -> list[tuple[int, int, date | None]]:
    """The numeric dates in ``query`` (see _ISO, _SLASHED, _DOTTED), each with where it stands; ``None``
    for one that looks like a date but names no day ("2/30")."""
    out: list[tuple[int, int, date | None]] = []
    for m in _ISO.finditer(query):
        out.append((m.start(), m.end(), _valid(int(m.group(1)), int(m.group(2)), int(m.group(3)))))
    for m in _SLASHED.finditer(query):
        first, second, year = int(m.group(1)), int(m.group(2)), m.group(3)
        announced = _DATE_WORD.search(query, _before(m.start()), m.start()) is not None
        if year is None and not announced:
            # "1/2 cup", "3/4", "8/10", "10/10": a fraction or a score. "24/7", "22/7": no month first.
            if first > 12 or (first <= second and second in _DENOMINATORS) or _UNIT.match(query, m.end()):
                continue
        elif year is None and _UNIT.match(query, m.end()):
            continue  # "after 3/4 of the season"
        month, number = (first, second) if first <= 12 else (second, first)
        out.append((m.start(), m.end(), _named(month, number, year, today)))
    for m in _DOTTED.finditer(query):
        if m.group(3) is None and _DATE_WORD.search(query, _before(m.start()), m.start()) is None:
            continue  # "it was 22.7." is more likely a decimal
        out.append((m.start(), m.end(), _named(int(m.group(2)), int(m.group(1)), m.group(3), today)))
    return out


def _named(month: int, day: int, year: str | None, today: date) -> date | None:
    """The day a date names: in ``year`` ("23" is 2023), else its latest one not after today."""
    if year is not None:
        return _valid(int(year) + (2000 if len(year) == 2 else 0), month, day)
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    return _latest(today.year if (month, day) <= (today.month, today.day) else today.year - 1, month, day)


def _valid(year: int, month: int, day: int) -> date | None:
    """The day, or ``None`` when there is none ("2/30") or it lies at the calendar's edge: "9999-12-31"
    and "0001-01-01" are placeholders ("valid until 9999-12-31", a pasted log's empty date), and a
    day either side of them, or their midnight in a time zone, is no ``datetime`` at all."""
    if not date.min.year < year < date.max.year:
        return None
    try:
        return date(year, month, day)
    except ValueError:
        return None


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


def _whole_month(year: int, month: int) -> tuple[date, date] | None:
    """The first and last day of a month a query names with its year; ``None`` at the calendar's edge
    (see :func:`_valid`)."""
    first = _valid(year, month, 1)
    return None if first is None else (first, _month_end(year, month))


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
