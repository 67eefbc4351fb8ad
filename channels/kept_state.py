"""The record of sent answers Telegram and Discord keep: how far each answer cut short got, and which
preview each chat's answer streams in, so that after a kill only the rest goes out (each channel's
``sent.py`` says what it measures and how it writes it).

:class:`SentRecord` keeps both maps newest last, the oldest dropped past ``limit`` (:func:`put`), and
writes the file whole, atomically, whenever a change must survive a kill; what was only forgotten (an
answer finished, a preview its answer went into) goes with the next write or :meth:`SentRecord.close`.
The file is read forgivingly (:func:`read`): a missing file is empty, an unreadable one is logged and
counts as empty (it only spares a part sent twice), and a damaged one is moved aside for the operator.
A failed write is logged and costs only what the file adds: the process still remembers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import structlog

from bot import damaged
from bot.errors import StorageError
from bot.storage import atomic_write_text

log = structlog.get_logger(__name__)

T = TypeVar("T")
V = TypeVar("V")

LIMIT = 200  # answers cut short, and chats with a preview, that a record keeps
Previews = dict[str, tuple[str, int]]  # chat id -> (the message answered, the preview's id)


class SentRecord(Generic[V]):
    """How far each answer got (``V``, the channel's measure; ``nothing`` when none of it went out) and
    the preview each chat's answer streams in; :meth:`load` before the first send, :meth:`close` when
    the channel stops. ``encode`` and ``parse`` turn both maps into the file's JSON and back (``parse``
    raises one of ``damaged.UNREADABLE`` on a damaged file); ``event`` prefixes the log's events.
    ``path`` ``None`` keeps them in memory only."""

    def __init__(
        self,
        path: Path | None,
        *,
        nothing: V,
        encode: Callable[[dict[str, V], Previews], Any],
        parse: Callable[[Any], tuple[dict[str, V], Previews]],
        event: str,
        limit: int = LIMIT,
    ) -> None:
        self._path = path
        self._nothing = nothing
        self._encode = encode
        self._parse = parse
        self._event = event
        self._limit = limit
        self._sent: dict[str, V] = {}  # answer key -> how far it got; insertion order: oldest first
        self._previews: Previews = {}
        self._lock = asyncio.Lock()  # one write at a time, each a snapshot
        self._stale = False  # something was forgotten that the file still holds

    async def load(self) -> None:
        if self._path is not None:
            found = await asyncio.to_thread(read, self._path, self._parse, event=self._event)
            self._sent, self._previews = found if found is not None else ({}, {})
            self._stale = False

    def get(self, key: str) -> V:
        """How far the answer ``key`` got already (``nothing``: none of it, or the answer is unknown)."""
        return self._sent.get(key, self._nothing)

    async def record(self, key: str, got: V) -> None:
        """The answer ``key`` got this far, and more is to come: kept durably before the next send."""
        put(self._sent, key, got, self._limit)
        await self._save()

    def finished(self, key: str) -> None:
        """The whole answer went out: forgotten (from the file with the next write)."""
        if self._sent.pop(key, None) is not None:
            self._stale = True

    def preview(self, chat_id: str, reply_to: str | None) -> int | None:
        """The id of the preview the answer to ``reply_to`` streams in, if one is known."""
        chat = self._previews.get(chat_id)
        return chat[1] if chat is not None and reply_to is not None and chat[0] == reply_to else None

    async def record_preview(self, chat_id: str, reply_to: str | None, message_id: int) -> None:
        """The answer to ``reply_to`` streams in the message ``message_id``: kept durably. Without a
        ``reply_to`` no later answer could be matched to it, and nothing is kept."""
        if reply_to is None:
            return
        put(self._previews, chat_id, (reply_to, message_id), self._limit)
        await self._save()

    def preview_done(self, chat_id: str, reply_to: str | None) -> None:
        """The answer to ``reply_to`` went out: its preview is forgotten (from the file with the next
        write)."""
        if self.preview(chat_id, reply_to) is not None:
            del self._previews[chat_id]
            self._stale = True

    async def close(self) -> None:
        """Write what was forgotten since the last write, so the file keeps only answers cut short."""
        if self._stale:
            await self._save()

    async def _save(self) -> None:
        if self._path is None:
            return
        path = self._path
        try:
            async with self._lock:  # the newest state, whichever write comes last
                self._stale = False
                text = json.dumps(self._encode(self._sent, self._previews)) + "\n"
                await asyncio.to_thread(atomic_write_text, path, text)
        except (OSError, StorageError) as exc:
            self._stale = True
            log.warning(f"{self._event}_not_saved", path=str(path), error=str(exc))


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
