"""Time words in a query ("in March", "last week", "yesterday") as a filter on when items were said.

Memory knows when everything was said, so a question that names a time can prefer what was said
then. The hint only adds to a score; it never hides an item, because people misremember dates.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

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
_MONTH = re.compile(
    r"\b(?:in|during|since|of|early|late|mid|last)\s+("
    + "|".join(sorted(MONTHS, key=len, reverse=True))
    + r")\b",
    re.I,
)
_WINDOWS = (
    (re.compile(r"\b(today|this morning|tonight)\b", re.I), 1),
    (re.compile(r"\byesterday\b", re.I), 2),
    (re.compile(r"\b(last|past|this) (few )?days?\b", re.I), 4),
    (re.compile(r"\b(last|past|this) week(end)?\b", re.I), 8),
    (re.compile(r"\b(last|past) (two|2|couple of) weeks\b", re.I), 15),
    (re.compile(r"\b(last|past|this) month\b", re.I), 32),
    (re.compile(r"\b(last|past) (few|two|three|couple of) months\b", re.I), 95),
)

TimeMatch = Callable[[datetime], bool]


def time_hint(query: str, now: datetime, tz: ZoneInfo) -> TimeMatch | None:
    """A predicate for "said in the period the query names", or ``None`` when it names none."""
    months = {MONTHS[m.group(1).lower()] for m in _MONTH.finditer(query)}
    days = next((d for pattern, d in _WINDOWS if pattern.search(query)), None)
    if not months and days is None:
        return None
    since = now - timedelta(days=days) if days is not None else None

    def matches(when: datetime) -> bool:
        if since is not None and since <= when <= now:
            return True
        return when.astimezone(tz).month in months

    return matches
