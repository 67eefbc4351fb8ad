"""Where the bot stands in each Discord chat it talks in: the newest message id it has seen there.

Discord replays nothing to a new gateway session (IDENTIFY); only a RESUME replays missed events. So
what users wrote while the bot was down, or while a session could not be resumed, has to be read from
the channel history, and that needs a starting point per chat: the newest message the bot took in
there (``state/discord_seen.json``, written atomically like the rest of the workspace).

- A chat is tracked from the first message handed to the dispatcher; from then on every message seen
  there (answered, ignored for want of a mention, denied) moves its mark forward, so the next catch-up
  does not read the same chatter again. The channel moves a mark only under the chat's intake lock,
  after the message needed nothing more (a handed-over one is in the durable inbox by then), so a mark
  never passes a message that could still be lost, only those the catch-up skips on purpose (too old,
  or older than the newest it takes in).
- At READY after IDENTIFY, :meth:`SeenMarks.begin` freezes each chat's mark as the point its catch-up
  reads after. Until that chat is caught up, the file keeps the frozen point, not what live messages
  moved the mark to: a crash, or a session replaced before its catch-up ended, reads the gap again.
- Beside the marks, one workspace-wide point: the bot was connected until then (``connected_until``,
  a snowflake), so a chat it never tracked needs reading only if something was written there since.
  It moves with the live gateway events (each message id, Discord's own clock; written at most every
  few seconds, a lower point on disk only reads more) and to the session's start once a fresh
  session's catch-up of the untracked chats ended (:meth:`SeenMarks.connected_through`). From
  :meth:`SeenMarks.begin` until then the file keeps the earlier point, as it keeps the chats' frozen
  points, so a crash during the catch-up reads the gap again. It does not move to the stop time: a
  gateway that died silently looks connected until its heartbeat is missed. No point yet (the first
  start, or a file from before it existed): the catch-up of untracked chats reads nothing.
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
# How far the live point runs ahead of the file before it is written: a burst of guild chatter costs a
# write every few seconds, not one per message (snowflake units: milliseconds shifted by 22 bits).
_WRITE_EVERY = 5_000 << 22


class SeenMarks:
    """The newest message id seen per tracked chat (see the module doc). ``load`` before use.

    Chat and message ids are Discord snowflakes: a later message has a larger id.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._newest: dict[str, int] = {}
        self._catching_up: dict[str, int] = {}  # chat -> the point its pending catch-up reads after
        self._until: int | None = None  # connected until then: the point on disk (see the module doc)
        self._live_until: int | None = None  # the newest live event, ahead of ``_until`` by a little
        self._covering = False  # a session's catch-up of untracked chats has not ended: ``_until`` waits
        self._version = 0  # bumped by every change; ``_saved`` is the newest version on disk
        self._saved = 0
        self._writer: asyncio.Task[None] | None = None
        self._outage = StorageOutage("the Discord seen-message marks")
        self._unread = False  # the file could not be read at load: it is not written over

    async def load(self) -> None:
        """Read the marks; an unreadable file is logged and costs only this start's catch-up, never the
        start. It is not written over in this run (the first new mark replaced it, and every later start
        lost the catch-up of the chats it tracked): the next start reads it."""
        try:
            self._newest, self._until = await asyncio.to_thread(_read, self._path)
        except OSError as exc:
            self._unread = True
            log.error(
                "discord_seen_marks_unreadable",
                path=str(self._path),
                error=exc.strerror or str(exc),
                kept="not written over in this run: the next start reads it",
            )

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
        self._covering = True
        return dict(self._catching_up)

    @property
    def connected_until(self) -> int | None:
        """The bot was connected until this snowflake (None: never yet); frozen from ``begin`` until
        ``connected_through``, so it is the point the pending catch-up of untracked chats reads after."""
        return self._until

    def heard(self, event_id: int) -> None:
        """A live gateway event with this snowflake arrived: the bot was connected until then."""
        self._live_until = max(event_id, self._live_until or 0)
        if not self._covering and self._live_until - (self._until or 0) >= _WRITE_EVERY:
            self._until = self._live_until
            self._changed()

    def connected_through(self, session_start: int) -> None:
        """The catch-up of a fresh session's untracked chats ended: what was written before
        ``session_start`` was read, what came after arrived live."""
        self._covering = False
        until = max(session_start, self._until or 0, self._live_until or 0)
        if until != self._until:
            self._until = until
            self._changed()

    def caught_up_to(self, chat_id: str, message_id: int) -> None:
        """The catch-up of ``chat_id`` took in (or skipped) everything up to ``message_id``."""
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
        """Wait for the write in flight, then make one last attempt to save (the live point with it,
        unless a catch-up still holds it)."""
        if not self._covering and self._live_until is not None and self._live_until > (self._until or 0):
            self._until = self._live_until
            self._version += 1
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
        while self._saved < self._version and not self._unread:
            version = self._version
            marks = {chat: str(self._catching_up.get(chat, mid)) for chat, mid in self._newest.items()}
            data: dict[str, Any] = {"newest": marks}
            if self._until is not None:
                data["connected_until"] = str(self._until)
            try:
                await asyncio.to_thread(atomic_write_text, self._path, json.dumps(data) + "\n")
            except OSError as exc:
                self._outage.failed(exc)
                return
            self._saved = version
        self._outage.recovered()


def _read(path: Path) -> tuple[dict[str, int], int | None]:
    """The marks and the connected-until point on disk; a damaged file is moved aside (kept for the
    operator) and logged."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}, None
    try:
        data: Any = json.loads(raw.decode("utf-8"))
        marks = {str(chat): int(mid) for chat, mid in data["newest"].items()}
        until = data.get("connected_until")  # absent in a file from before the point existed
        return marks, int(until) if until is not None else None
    except damaged.UNREADABLE:  # (Infinity where an id belongs: OverflowError)
        damaged.move_aside(path, raw, event="discord_seen_marks_damaged")
        return {}, None
