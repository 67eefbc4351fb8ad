"""Where the bot stands in each Discord chat it talks in: the newest message id it has seen there.

Discord replays nothing to a new gateway session (IDENTIFY); only a RESUME replays missed events. So
what users wrote while the bot was down, or while a session could not be resumed, has to be read from
the channel history, and that needs a starting point per chat: the newest message the bot took in
there (``state/discord_seen.json``, written atomically like the rest of the workspace).

- A chat is tracked from the first message handed to the dispatcher; from then on every message seen
  there (answered, ignored for want of a mention, denied) moves its mark forward, so the next catch-up
  does not read the same chatter again. The channel moves a mark only under the chat's intake lock,
  after the message needed nothing more (a handed-over one is in the durable inbox by then), so a mark
  never passes a message that could still be lost.
- At READY after IDENTIFY, :meth:`SeenMarks.begin` freezes each chat's mark as the point its catch-up
  reads after. Until that chat is caught up, the file keeps the frozen point, not what live messages
  moved the mark to: a crash, or a session replaced before its catch-up ended, reads the gap again.
- Reading a little again is harmless (the dispatcher takes a platform message id once); writes are
  coalesced (a burst costs one write in flight and one after it) and a failed write is logged and
  tried again with the next change, never in the way of a message.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import structlog

from bot import damaged
from bot.storage import atomic_write_text
from channels.outage import StorageOutage

log = structlog.get_logger(__name__)

SEEN_FILE = "discord_seen.json"


class SeenMarks:
    """The newest message id seen per tracked chat (see the module doc). ``load`` before use.

    Chat and message ids are Discord snowflakes: a later message has a larger id.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._newest: dict[str, int] = {}
        self._catching_up: dict[str, int] = {}  # chat -> the point its pending catch-up reads after
        self._version = 0  # bumped by every change; ``_saved`` is the newest version on disk
        self._saved = 0
        self._writer: asyncio.Task[None] | None = None
        self._outage = StorageOutage("the Discord seen-message marks")

    async def load(self) -> None:
        """Read the marks; an unreadable file is logged and costs only the catch-up, never the start."""
        try:
            self._newest = await asyncio.to_thread(_read, self._path)
        except OSError as exc:
            log.error("discord_seen_marks_unreadable", path=str(self._path), error=exc.strerror or str(exc))

    def saw(self, chat_id: str, message_id: int, *, start: bool) -> None:
        """``message_id`` needs nothing more in ``chat_id``; ``start`` tracks a chat not tracked yet."""
        if chat_id not in self._newest and not start:
            return
        if message_id > self._newest.get(chat_id, 0):
            self._newest[chat_id] = message_id
            self._changed()

    def begin(self) -> dict[str, int]:
        """A fresh gateway session: the point each tracked chat's catch-up reads after.

        A chat whose earlier catch-up never ended keeps its earlier point (the gap since is read too).
        """
        for chat_id, newest in self._newest.items():
            self._catching_up.setdefault(chat_id, newest)
        return dict(self._catching_up)

    def caught_up_to(self, chat_id: str, message_id: int) -> None:
        """The catch-up of ``chat_id`` took everything up to ``message_id`` in."""
        if chat_id in self._catching_up and message_id > self._catching_up[chat_id]:
            self._catching_up[chat_id] = message_id
            self._changed()
        self.saw(chat_id, message_id, start=False)

    def caught_up(self, chat_id: str) -> None:
        """The catch-up of ``chat_id`` ended: the file follows its live mark again."""
        if self._catching_up.pop(chat_id, None) is not None:
            self._changed()

    def forget(self, chat_id: str) -> None:
        """Stop tracking a chat the bot can no longer read (it is tracked again once answered there)."""
        self._catching_up.pop(chat_id, None)
        if self._newest.pop(chat_id, None) is not None:
            self._changed()

    async def close(self) -> None:
        """Wait for the write in flight, then make one last attempt to save."""
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        if self._saved < self._version:
            await self._write_all()

    def _changed(self) -> None:
        self._version += 1
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all(), name="discord-seen-marks")

    async def _write_all(self) -> None:
        """Write snapshots until the newest change is on disk; stop at a failure (the next change retries)."""
        while self._saved < self._version:
            version = self._version
            marks = {chat: str(self._catching_up.get(chat, mid)) for chat, mid in self._newest.items()}
            try:
                await asyncio.to_thread(atomic_write_text, self._path, json.dumps({"newest": marks}) + "\n")
            except OSError as exc:
                self._outage.failed(exc)
                return
            self._saved = version
        self._outage.recovered()


def _read(path: Path) -> dict[str, int]:
    """The marks on disk; a damaged file is moved aside (kept for the operator) and logged."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        data: Any = json.loads(raw.decode("utf-8"))
        return {str(chat): int(mid) for chat, mid in data["newest"].items()}
    except damaged.UNREADABLE:  # (Infinity where an id belongs: OverflowError)
        damaged.move_aside(path, raw, event="discord_seen_marks_damaged")
        return {}
