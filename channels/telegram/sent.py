"""How far each long answer got: the chunks Telegram took, on disk, so a restart sends only the rest.

An answer longer than one message goes out in chunks, paced about one a second per chat, and its
inbox entries are marked done only once the last one went out (``bot/outbox.py``). Killed between two
chunks, the next start sent the answer again from its first chunk: the chat got those chunks twice.
So after each chunk but the last, :class:`SentChunks` writes how many chunks of the answer (by its
key, the pending reply's id, the same after a restart) Telegram took, and a send of that answer skips
them. The window left is the one no platform lets us close: Telegram took a chunk and the process died
before the write of that fact reached the disk (one fsync). The last chunk is not written here: what
follows it is the inbox's done mark, whose window is as wide.

``state/telegram_sent.json`` holds ``{"answers": {key: chunks}}`` for the newest ``limit`` answers cut
short; a finished answer is dropped with the next write. A write that fails (a full disk) is logged and
only costs what this file adds: the process still remembers, a restart would send those chunks again.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import structlog

from bot import damaged
from bot.errors import StorageError
from bot.storage import atomic_write_text

log = structlog.get_logger(__name__)

SENT_FILE = "telegram_sent.json"
LIMIT = 200


class SentChunks:
    """Chunks of each answer Telegram took (see the module doc); :meth:`load` before the first send.

    ``path`` ``None`` keeps them in memory only (tests of the channel's parts)."""

    def __init__(self, path: Path | None, *, limit: int = LIMIT) -> None:
        self._path = path
        self._limit = limit
        self._sent: dict[str, int] = {}  # insertion order: oldest first
        self._lock = asyncio.Lock()  # one write at a time, each a snapshot

    async def load(self) -> None:
        if self._path is not None:
            self._sent = await asyncio.to_thread(_read, self._path)

    def get(self, key: str) -> int:
        """How many of the answer's chunks went out already (0: none, or the answer is unknown)."""
        return self._sent.get(key, 0)

    async def record(self, key: str, chunks: int) -> None:
        """``chunks`` of the answer ``key`` went out, and more are to come: kept durably before the next."""
        self._sent.pop(key, None)
        self._sent[key] = chunks
        while len(self._sent) > self._limit:
            del self._sent[next(iter(self._sent))]
        if self._path is None:
            return
        path = self._path
        try:
            async with self._lock:  # the newest state, whichever write comes last
                text = json.dumps({"answers": self._sent}) + "\n"
                await asyncio.to_thread(atomic_write_text, path, text)
        except (OSError, StorageError) as exc:
            log.warning("telegram_sent_chunks_not_saved", path=str(path), error=str(exc))

    def finished(self, key: str) -> None:
        """The whole answer went out: forgotten (on disk with the next write)."""
        self._sent.pop(key, None)


def _read(path: Path) -> dict[str, int]:
    """What the file says; an unreadable one counts as empty (it only saves duplicate chunks), and a
    damaged one is moved aside (kept for the operator) and logged."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.warning("telegram_sent_chunks_unreadable", path=str(path), error=exc.strerror or str(exc))
        return {}
    try:
        data: Any = json.loads(raw.decode("utf-8"))
        answers = data["answers"]
        return {str(k): v for k, v in answers.items() if isinstance(v, int) and v > 0}
    except damaged.UNREADABLE:
        damaged.move_aside(path, raw, event="telegram_sent_chunks_damaged")
        return {}
