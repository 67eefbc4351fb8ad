"""How far each answer got: the chunks Telegram took and the preview it streams in, on disk, so a
restart sends only the rest.

An answer longer than one message goes out in chunks, paced about one a second per chat, and its
inbox entries are marked done only once the last one went out (``bot/outbox.py``). Killed between two
chunks, the next start sent the answer again from its first chunk: the chat got those chunks twice.
So after each chunk but the last, :class:`SentChunks` writes how many chunks of the answer (by its
key, the pending reply's id, the same after a restart) Telegram took, and a send of that answer skips
them. A chunk Telegram finds too long goes out halved (:mod:`channels.telegram.outbound`), and the
record follows the halves: ``(2, 1)`` says two chunks and the first half of the third went out (a half
halved again adds a number). The halves are cut the same way each time, so a send that goes on from
a half sends exactly the halves not yet shown. The window left is the one no platform lets us close:
Telegram took a message and the process died before the write of that fact reached the disk (one
fsync). The last message is not written here: what follows it is the inbox's done mark, whose window
is as wide.

A streamed answer (``telegram.streaming``) is shown as it comes in one preview message. Killed before
the answer went out, the preview stayed in the chat, and the answer sent after the restart (saved, or
asked for anew and streamed again) came as new messages: the chat saw its start twice. So the preview's
message id is written too, per chat, with the id of the message it answers (the turn's first, which
the answer's ``reply_to`` names: an answer to another question never takes it over). The answer to
that message then goes into the preview, as in the same run; the write costs one fsync per streamed
answer.

``state/telegram_sent.json`` holds ``{"answers": {key: chunks}, "previews": {chat: [reply_to, id]}}``
(``[chunks, halves, ...]`` once a chunk went out in part) for the newest ``limit`` answers cut short
and chats with a preview; a finished answer, and a preview its answer went into, are dropped with the
next write. A write that fails (a full disk) is logged and only costs what this file adds: the
process still remembers, a restart would send those messages again.
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

SENT_FILE = "telegram_sent.json"
LIMIT = 200

Progress = tuple[int, ...]
"""How far an answer got: its first ``progress[0]`` chunks went out and, when a chunk went out halved,
``progress[1]`` halves of the next one (and so on, inside a half halved again). ``()``: nothing yet."""


class SentChunks:
    """Chunks of each answer Telegram took, and the preview each chat's answer streams in (see the
    module doc); :meth:`load` before the first send.

    ``path`` ``None`` keeps them in memory only (tests of the channel's parts)."""

    def __init__(self, path: Path | None, *, limit: int = LIMIT) -> None:
        self._path = path
        self._limit = limit
        self._sent: dict[str, Progress] = {}  # insertion order: oldest first
        self._previews: dict[str, tuple[str, int]] = {}  # chat id -> (the message answered, the preview)
        self._lock = asyncio.Lock()  # one write at a time, each a snapshot

    async def load(self) -> None:
        if self._path is not None:
            self._sent, self._previews = await asyncio.to_thread(_read, self._path)

    def get(self, key: str) -> Progress:
        """How far the answer got already (``()``: nothing went out, or the answer is unknown)."""
        return self._sent.get(key, ())

    async def record(self, key: str, progress: Progress) -> None:
        """The answer ``key`` got this far, and more is to come: kept durably before the next send."""
        put(self._sent, key, progress, self._limit)
        await self._save()

    def finished(self, key: str) -> None:
        """The whole answer went out: forgotten (on disk with the next write)."""
        self._sent.pop(key, None)

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
        """The answer to ``reply_to`` went out: its preview is forgotten (on disk with the next write)."""
        if self.preview(chat_id, reply_to) is not None:
            del self._previews[chat_id]

    async def _save(self) -> None:
        if self._path is None:
            return
        path = self._path
        try:
            async with self._lock:  # the newest state, whichever write comes last
                answers = {key: got[0] if len(got) == 1 else list(got) for key, got in self._sent.items()}
                previews = {chat: list(seen) for chat, seen in self._previews.items()}
                text = json.dumps({"answers": answers, "previews": previews}) + "\n"
                await asyncio.to_thread(atomic_write_text, path, text)
        except (OSError, StorageError) as exc:
            log.warning("telegram_sent_chunks_not_saved", path=str(path), error=str(exc))


def _read(path: Path) -> tuple[dict[str, Progress], dict[str, tuple[str, int]]]:
    """What the file says (channels/kept_state.py: a missing or unreadable file is empty, a damaged one
    moved aside)."""
    found = kept_state.read(path, _parsed, event="telegram_sent_chunks")
    return found if found is not None else ({}, {})


def _parsed(data: Any) -> tuple[dict[str, Progress], dict[str, tuple[str, int]]]:
    found = {str(k): _progress(v) for k, v in data["answers"].items()}
    previews = {
        str(chat): (seen[0], seen[1])
        for chat, seen in data.get("previews", {}).items()  # none before previews were kept
        if isinstance(seen, list) and len(seen) == 2 and isinstance(seen[0], str) and is_count(seen[1])
    }
    return {k: v for k, v in found.items() if v}, previews


def _progress(value: Any) -> Progress:
    """A stored record: a count of chunks (all an earlier version wrote), or a list that goes into
    halves; ``()`` for anything else, or for nothing sent."""
    got = [value] if isinstance(value, int) else value
    if not isinstance(got, list) or not got:
        return ()
    if not all(is_count(n) for n in got) or not any(got):
        return ()
    return tuple(got)
