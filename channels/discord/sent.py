"""How far each answer got on Discord: the parts that went out and the preview it streams in, on disk,
so a restart sends only the rest, and in the right message.

A streamed answer (``discord.streaming``) is shown as it comes in one preview message, ending in " …".
Killed before the answer went out (or stopped past the grace period), the preview stayed in the chat,
and the answer the next start sent (saved, or asked for anew and streamed again) came as new messages
below it: half an answer above the whole one. So the preview's message id is written as soon as
Discord posted it, per chat, with the id of the message it answers (the turn's first, which the
answer's ``reply_to`` names: an answer to another question never takes it over). The answer to that
message then goes into the preview, whether it is sent again after a failure, after a restart, or
streamed anew; one the user (a moderator) deleted is sent as a new message instead. The write costs one
fsync per streamed answer.

An answer longer than one message goes out in parts, and its inbox entries are marked done only once
the last one went out (``bot/outbox.py``). Each part carries a nonce made from the answer's key, but
Discord checks a nonce only against the past few minutes: sent again later (a restart after a longer
outage, a send the dispatcher tries again after minutes of failures), the parts that went out came a
second time, and a first part that went into a preview never had a nonce at all. So after each part
but the last, :class:`SentParts` writes how many parts of the answer (by its key, the pending reply's
id, the same after a restart) Discord took, and a send of that answer skips them. The window left is
the one no platform lets us close: Discord took a message and the process died before the write of
that fact reached the disk (one fsync; within minutes the nonce still covers it).

``state/discord_sent.json`` holds ``{"answers": {key: parts}, "previews": {chat: [reply_to, id]}}``
(ids as strings, as Discord writes its snowflakes) for the newest ``limit`` answers cut short and chats
with a preview. A finished answer, and a preview its answer went into, are forgotten at once and
dropped from the file with the next write (or when the channel stops). A write that fails (a full
disk) is logged and only costs what this file adds: the process still remembers, a restart would send
those parts again, or the answer below its preview.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import structlog

from bot.errors import StorageError
from bot.storage import atomic_write_text
from channels import kept_state
from channels.kept_state import is_count, put

log = structlog.get_logger(__name__)

SENT_FILE = "discord_sent.json"
LIMIT = 200


class SentParts:
    """Parts of each answer Discord took, and the preview each chat's answer streams in (see the module
    doc); :meth:`load` before the first send, :meth:`close` when the channel stops.

    ``path`` ``None`` keeps them in memory only."""

    def __init__(self, path: Path | None, *, limit: int = LIMIT) -> None:
        self._path = path
        self._limit = limit
        self._sent: dict[str, int] = {}  # answer key -> parts sent; insertion order: oldest first
        self._previews: dict[str, tuple[str, int]] = {}  # chat id -> (the message answered, the preview)
        self._lock = asyncio.Lock()  # one write at a time, each a snapshot
        self._stale = False  # something was forgotten that the file still holds

    async def load(self) -> None:
        if self._path is not None:
            self._sent, self._previews = await asyncio.to_thread(_read, self._path)
            self._stale = False

    def get(self, key: str) -> int:
        """How many parts of the answer went out already (0: none, or the answer is unknown)."""
        return self._sent.get(key, 0)

    async def record(self, key: str, parts: int) -> None:
        """The first ``parts`` parts of the answer ``key`` went out, and more are to come: kept durably
        before the next part is sent."""
        put(self._sent, key, parts, self._limit)
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
                previews = {chat: [seen[0], str(seen[1])] for chat, seen in self._previews.items()}
                text = json.dumps({"answers": dict(self._sent), "previews": previews}) + "\n"
                await asyncio.to_thread(atomic_write_text, path, text)
        except (OSError, StorageError) as exc:
            self._stale = True
            log.warning("discord_sent_parts_not_saved", path=str(path), error=str(exc))


def _read(path: Path) -> tuple[dict[str, int], dict[str, tuple[str, int]]]:
    """What the file says (channels/kept_state.py: a missing or unreadable file is empty, a damaged one
    moved aside)."""
    found = kept_state.read(path, _parsed, event="discord_sent_parts")
    return found if found is not None else ({}, {})


def _parsed(data: Any) -> tuple[dict[str, int], dict[str, tuple[str, int]]]:
    answers = {str(key): parts for key, parts in data["answers"].items() if is_count(parts) and parts}
    previews = {
        str(chat): (seen[0], int(seen[1]))
        for chat, seen in data["previews"].items()
        if isinstance(seen, list) and len(seen) == 2 and isinstance(seen[0], str) and _is_id(seen[1])
    }
    return answers, previews


def _is_id(value: Any) -> bool:
    """A snowflake as the file writes it: a string of digits."""
    return isinstance(value, str) and value.isascii() and value.isdigit()
