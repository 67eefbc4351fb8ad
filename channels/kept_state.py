"""What Telegram's and Discord's records of sent answers share: a bounded map, and a forgiving read.

Each channel keeps a small JSON file in the state folder (``telegram_sent.json``, ``discord_sent.json``)
of how far an answer cut short got and which preview a chat shows, so that after a kill only the rest
goes out. Both keep their entries newest last, the oldest dropped past a limit (:func:`put`), and both
read the file forgivingly (:func:`read`): a missing file is empty, an unreadable one is logged and
counts as empty (it only spares a part sent twice), and a damaged one is moved aside for the operator.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import structlog

from bot import damaged

log = structlog.get_logger(__name__)

T = TypeVar("T")


def put(kept: dict[str, Any], key: str, value: Any, limit: int) -> None:
    """``kept[key] = value`` as its newest entry, the oldest dropped past ``limit``."""
    kept.pop(key, None)
    kept[key] = value
    while len(kept) > limit:
        del kept[next(iter(kept))]


def read(path: Path, parse: Callable[[Any], T], *, event: str) -> T | None:
    """``parse`` of the file's JSON; None when there is no file, or (logged as ``<event>_unreadable``)
    one that cannot be read, or one ``parse`` or JSON finds damaged, moved aside (``<event>_damaged``)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning(f"{event}_unreadable", path=str(path), error=exc.strerror or str(exc))
        return None
    try:
        return parse(json.loads(raw.decode("utf-8")))
    except damaged.UNREADABLE:
        damaged.move_aside(path, raw, event=f"{event}_damaged")
        return None


def is_count(value: Any) -> bool:
    """An int from 0 up, not a bool (JSON's ``true`` reads as one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
