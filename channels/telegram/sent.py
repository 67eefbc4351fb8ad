"""How far each long answer got: the chunks Telegram took, on disk, so a restart sends only the rest.

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

``state/telegram_sent.json`` holds ``{"answers": {key: chunks}}`` (``[chunks, halves, ...]`` once a
chunk went out in part) for the newest ``limit`` answers cut short; a finished answer is dropped with
the next write. A write that fails (a full disk) is logged and only costs what this file adds: the
process still remembers, a restart would send those messages again.
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

Progress = tuple[int, ...]
"""How far an answer got: its first ``progress[0]`` chunks went out and, when a chunk went out halved,
``progress[1]`` halves of the next one (and so on, inside a half halved again). ``()``: nothing yet."""


class SentChunks:
    """Chunks of each answer Telegram took (see the module doc); :meth:`load` before the first send.

    ``path`` ``None`` keeps them in memory only (tests of the channel's parts)."""

    def __init__(self, path: Path | None, *, limit: int = LIMIT) -> None:
        self._path = path
        self._limit = limit
        self._sent: dict[str, Progress] = {}  # insertion order: oldest first
        self._lock = asyncio.Lock()  # one write at a time, each a snapshot

    async def load(self) -> None:
        if self._path is not None:
            self._sent = await asyncio.to_thread(_read, self._path)

    def get(self, key: str) -> Progress:
        """How far the answer got already (``()``: nothing went out, or the answer is unknown)."""
        return self._sent.get(key, ())

    async def record(self, key: str, progress: Progress) -> None:
        """The answer ``key`` got this far, and more is to come: kept durably before the next send."""
        self._sent.pop(key, None)
        self._sent[key] = progress
        while len(self._sent) > self._limit:
            del self._sent[next(iter(self._sent))]
        if self._path is None:
            return
        path = self._path
        try:
            async with self._lock:  # the newest state, whichever write comes last
                answers = {key: got[0] if len(got) == 1 else list(got) for key, got in self._sent.items()}
                text = json.dumps({"answers": answers}) + "\n"
                await asyncio.to_thread(atomic_write_text, path, text)
        except (OSError, StorageError) as exc:
            log.warning("telegram_sent_chunks_not_saved", path=str(path), error=str(exc))

    def finished(self, key: str) -> None:
        """The whole answer went out: forgotten (on disk with the next write)."""
        self._sent.pop(key, None)


def _read(path: Path) -> dict[str, Progress]:
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
        found = {str(k): _progress(v) for k, v in answers.items()}
        return {k: v for k, v in found.items() if v}
    except damaged.UNREADABLE:
        damaged.move_aside(path, raw, event="telegram_sent_chunks_damaged")
        return {}


def _progress(value: Any) -> Progress:
    """A stored record: a count of chunks (all an earlier version wrote), or a list that goes into
    halves; ``()`` for anything else, or for nothing sent."""
    got = [value] if isinstance(value, int) else value
    if not isinstance(got, list) or not got:
        return ()
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in got) or not any(got):
        return ()
    return tuple(got)
