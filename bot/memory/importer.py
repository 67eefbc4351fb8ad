"""Replaying past conversations into memory through the normal write path.

Accepted JSON (optionally gzip'd):

- LongMemEval style: an object, or a list of objects, with parallel ``haystack_session_ids``,
  ``haystack_dates`` and ``haystack_sessions`` (each a list of ``{"role", "content"}`` turns);
- plain: ``{"sessions": [...]}`` or a list of sessions, each ``{"id", "date", "turns": [{"role",
  "content", "timestamp"?}]}``.

Dates may be ISO 8601 or LongMemEval's ``2023/05/30 (Tue) 10:18``; dates without a zone are read in
the memory time zone. Turns without their own timestamp follow the session date one second apart.
"""

from __future__ import annotations

import gzip
import json
import re
import shlex
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from bot.domain import Message, Role
from bot.errors import ConfigError

_LME_DATE = re.compile(r"^\s*(\d{4})/(\d{2})/(\d{2})(?:\s*\([A-Za-z]+\))?\s*(\d{1,2}):(\d{2})")


@dataclass(frozen=True, slots=True)
class ImportTurn:
    index: int
    message: Message


@dataclass(frozen=True, slots=True)
class ImportSession:
    id: str
    started: datetime
    turns: list[ImportTurn]


def parse_date(value: str, tz: ZoneInfo) -> datetime:
    m = _LME_DATE.match(value)
    if m:
        year, month, day, hour, minute = (int(g) for g in m.groups())
        return datetime(year, month, day, hour, minute, tzinfo=tz)
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError as exc:
        raise ConfigError(f"cannot read the date {value!r} (use ISO 8601, e.g. 2024-05-30T10:18)") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=tz)


def read_json(path: Path) -> Any:
    """Load a (possibly gzip'd) UTF-8 JSON file (a byte-order mark is allowed); blocking, call it in a
    thread."""
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw: bytes = f.read()
        return json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:  # a ValueError: which line, and what to do, is what helps here
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - raw.rfind(b"\n", 0, exc.start)
        source = shlex.quote(str(path))
        iconv = "iconv -f latin1 -t utf-8"
        convert = f"zcat {source} | {iconv}" if path.suffix == ".gz" else f"{iconv} {source}"
        raise ConfigError(
            f"{path} is not UTF-8 text (line {line}, column {column} is not): convert it first, e.g. "
            f"`{convert} > converted.json`, and import that"
        ) from exc
    except (OSError, ValueError, EOFError, zlib.error) as exc:  # a .gz cut short, or damaged
        raise ConfigError(f"cannot read conversations from {path}: {exc}") from exc


def sessions_from(data: Any, tz: ZoneInfo) -> list[ImportSession]:
    """Every session in ``data`` (either accepted shape), in time order."""
    out = list(_walk(data, tz))
    out.sort(key=lambda s: s.started)
    return out


def _walk(data: Any, tz: ZoneInfo) -> Iterator[ImportSession]:
    if isinstance(data, list):
        for entry in data:
            yield from _walk(entry, tz)
    elif isinstance(data, dict) and "haystack_sessions" in data:
        ids, dates, sessions = data["haystack_session_ids"], data["haystack_dates"], data["haystack_sessions"]
        if not len(ids) == len(dates) == len(sessions):
            raise ConfigError(
                f"haystack_session_ids ({len(ids)}), haystack_dates ({len(dates)}) and haystack_sessions "
                f"({len(sessions)}) must be lists of the same length, one entry per session"
            )
        for sid, date, turns in zip(ids, dates, sessions, strict=True):
            yield _session(str(sid), _date(date, f"session {sid!r}", tz), turns, tz)
    elif isinstance(data, dict) and "sessions" in data:
        yield from _walk(data["sessions"], tz)
    elif isinstance(data, dict) and "turns" in data:
        date = data.get("date") or data.get("started_at") or data.get("timestamp")
        if not date:
            raise ConfigError(
                f'session {data.get("id")!r} has no date: give it one, e.g. "date": "2024-05-30 10:00"'
            )
        sid = str(data.get("id") or date)
        yield _session(sid, _date(date, f"session {sid!r}", tz), data["turns"], tz)
    else:
        # The format is written out here: "see membot docs" named no page, and the README shows none.
        raise ConfigError(
            'unrecognized conversation format: expected {"sessions": [{"id": "s1", "date": '
            '"2024-05-30 10:00", "turns": [{"role": "user", "content": "..."}]}]} (or a list of such '
            "sessions, or LongMemEval's haystack_session_ids / haystack_dates / haystack_sessions)"
        )


def _session(sid: str, started: datetime, turns: Any, tz: ZoneInfo) -> ImportSession:
    if not isinstance(turns, list):
        raise ConfigError(f"session {sid!r}: its turns must be a list, not {type(turns).__name__}")
    out: list[ImportTurn] = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise ConfigError(
                f"session {sid!r}, turn {i}: a turn must be an object like "
                f'{{"role": "user", "content": "..."}}, not {type(turn).__name__}'
            )
        role = str(turn.get("role", "")).lower()
        if role not in ("user", "assistant"):
            continue
        stamp = turn.get("timestamp")
        when = _date(stamp, f"session {sid!r}, turn {i}", tz) if stamp else started + timedelta(seconds=i)
        message = Message(Role(role), str(turn.get("content") or ""), timestamp=when, id=f"{sid}#{i}")
        out.append(ImportTurn(i, message))
    return ImportSession(sid, started, out)


def _date(value: object, where: str, tz: ZoneInfo) -> datetime:
    """:func:`parse_date`, with an error that says which session or turn holds the bad date."""
    try:
        return parse_date(str(value), tz)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
