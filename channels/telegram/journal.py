"""The Telegram update journal: every update membot accepted, kept until the dispatcher has it.

Why it exists. ``getUpdates(offset=N)`` confirms *every* update below ``N``, and Telegram then forgets
them; a webhook's ``200`` does the same for one update. But a message first waits up to
``telegram.join_window`` for the rest of a split paste before it reaches the dispatcher's durable inbox.
If confirmation waited for the inbox, one chat that keeps typing would hold back the confirmation of
every other chat's updates, and after a crash Telegram would send those again: answered twice. And an
update that could not be stored must never be confirmed, or a restart loses it. So an update takes
three steps, each durable before the next:

1. **Accept** (:meth:`UpdateJournal.accept`): the raw update is written to ``state/telegram_updates.json``
   (temp file, fsync, rename). Only after that does the poller move the offset past it, or the webhook
   answer ``200``: confirmation no longer waits for any join window. When the write fails (a full disk)
   nothing is confirmed; the poller fetches the same updates again after a backoff, the webhook answers
   ``503`` and Telegram delivers again. An update the journal already knows is not accepted twice:
   that is the dedup of Telegram's redeliveries (after a crash before the confirming ``getUpdates``, a
   failed confirmation, or a webhook answer that got lost).
2. **Take in** (:meth:`next`): held updates come out in arrival order to the channel's access checks, the
   paste joiner and ``Dispatcher.submit``, which returns once the message is in the durable inbox
   (each chat's in that order, chats side by side: :mod:`channels.telegram.handover`).
3. **Release** (:meth:`release`): then the update moves from *held* to *done*. Updates that needed
   nothing (a stranger's, an ignored one) and updates given up as unprocessable are released too.

At start-up the held updates a previous process accepted but never handed over are taken in again,
before anything new. Invariants:

- Nothing lost: Telegram forgets an update only once it is held here; it leaves *held* only once the
  dispatcher has it durably (or, logged, once its processing failed three times for a reason other
  than storage). Storage failures are retried with backoff for as long as they last.
- Nothing duplicated: a redelivered update is found in *held* or *done* and skipped. A kill between the
  inbox's fsync and this file's (milliseconds per message; for a command, while its answer is sent)
  makes the next start hand that message over once more, and the dispatcher recognises its
  ``message_id`` (each part of a joined paste: ``InboundMessage.joined``) and drops it.
- Bounded: *done* keeps the newest ``done_limit`` ids (a redelivery repeats at most the last unconfirmed
  batch of <= 100 updates, or the webhook requests in flight). *held* takes ``held_limit`` updates; while
  it is full the poller stops fetching and the webhook answers ``503``, so Telegram keeps the rest.
- Ids, not a watermark: after a week without updates Telegram picks the next ``update_id`` at random,
  so "everything below X is done" would skip new messages.
- Per bot: update ids belong to one bot; another bot's token starts with an empty *done* list.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from bot import damaged
from bot.errors import StorageError
from bot.storage import atomic_write_text
from channels.outage import StorageOutage, is_storage_error

log = structlog.get_logger(__name__)

JOURNAL_FILE = "telegram_updates.json"
HELD_LIMIT = 500
DONE_LIMIT = 1000

Update = Mapping[str, Any]
"""An update as Telegram sent it (JSON object with an integer ``update_id``)."""


class UpdateJournal:
    """Accepted Telegram updates on disk (see the module doc); one per channel, loaded before polling.

    Args:
        path: the journal file (``<workspace>/state/telegram_updates.json``).
        outage: how failed writes back off and are logged.
        held_limit, done_limit: the bounds described in the module doc.
    """

    def __init__(
        self,
        path: Path,
        *,
        outage: StorageOutage | None = None,
        held_limit: int = HELD_LIMIT,
        done_limit: int = DONE_LIMIT,
    ) -> None:
        self._path = path
        self._outage = outage or StorageOutage("the Telegram update journal")
        self._held_limit = held_limit
        self._done_limit = done_limit
        self._bot_id: int | None = None
        self._held: dict[int, Update] = {}  # insertion order is arrival order
        self._done: dict[int, None] = {}  # an ordered set, oldest first
        self._incoming: asyncio.Queue[Update] = asyncio.Queue()
        self._room = asyncio.Event()
        self._room.set()
        self._lock = asyncio.Lock()  # one write at a time, each a snapshot of the whole journal
        self._version = 0  # bumped by every change; ``_saved`` is the newest version on disk
        self._saved = 0
        self._retry: asyncio.Task[None] | None = None

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def full(self) -> bool:
        return len(self._held) >= self._held_limit

    def knows(self, update_id: int) -> bool:
        """Accepted before (held or done): a redelivery, not a new update."""
        return update_id in self._held or update_id in self._done

    async def load(self, bot_id: int) -> int:
        """Read what earlier runs left and queue their held updates first; returns how many.

        Raises StorageError when the file cannot be read (held updates would be overwritten unseen).
        """
        try:
            data = await asyncio.to_thread(_read, self._path)
        except OSError as exc:
            raise StorageError(
                f"cannot read {self._path}: {exc.strerror or exc} (fix the workspace's permissions)"
            ) from exc
        held: list[Update] = data.get("held", [])  # checked by _read: updates with an integer update_id
        done: list[int] = data.get("done", []) if data.get("bot_id") == bot_id else []
        self._bot_id = bot_id
        self._held = {u["update_id"]: u for u in held}
        self._done = dict.fromkeys(done[-self._done_limit :])
        for update in self._held.values():
            self._incoming.put_nowait(update)
        self._update_room()
        if self._held:
            log.info("telegram_held_updates_resumed", count=len(self._held))
        return len(self._held)  # as many as were queued: an id listed twice is queued once

    async def accept(self, updates: Sequence[Update]) -> int:
        """Hold the updates not seen before, durably; returns how many were new.

        Raises the write's error when they could not be stored (StorageError when *held* is full):
        then nothing of this call is kept, and the caller must not confirm them to Telegram.
        """
        async with self._lock:
            new = {u["update_id"]: u for u in updates if not self.knows(u["update_id"])}
            if not new:
                return 0
            if self.full:
                log.warning("telegram_journal_full", held=len(self._held))
                raise StorageError(f"{len(self._held)} Telegram updates wait to be handed over; try later")
            self._held.update(new)
            self._version += 1
            mine = self._version
            try:
                await self._write()
            except BaseException as exc:
                for update_id in new:  # not on disk: forget them, so a redelivery is taken again
                    del self._held[update_id]
                if self._version == mine:  # nothing else changed meanwhile: nothing left to save
                    self._version -= 1
                if is_storage_error(exc):
                    self._outage.failed(exc)
                raise
            finally:
                self._update_room()
        self._outage.recovered()
        for update in new.values():
            self._incoming.put_nowait(update)
        return len(new)

    async def next(self) -> Update:
        """The next held update to take in, in arrival order; waits for one."""
        while True:
            update = await self._incoming.get()
            if update["update_id"] in self._held:
                return update

    async def release(self, update_ids: Iterable[int]) -> None:
        """The dispatcher has these (or they needed nothing): move them to *done*.

        A failed write is retried in the background with backoff; until it succeeds, a restart takes
        these updates in once more (never less).
        """
        changed = False
        for update_id in update_ids:
            if self._held.pop(update_id, None) is not None:
                self._done[update_id] = None
                changed = True
        if not changed:
            return
        while len(self._done) > self._done_limit:
            del self._done[next(iter(self._done))]
        self._version += 1
        self._update_room()
        try:
            await self._save()
        except Exception as exc:
            self._failed_save(exc)
        else:
            self._outage.recovered()

    async def room(self) -> None:
        """Wait until *held* has room (the poller's backpressure)."""
        await self._room.wait()

    async def close(self) -> None:
        """Stop retrying in the background and make one last attempt to save."""
        retry, self._retry = self._retry, None
        if retry is not None:
            retry.cancel()
            await asyncio.gather(retry, return_exceptions=True)
        if self._saved < self._version:
            try:
                await self._save()
            except Exception as exc:
                log.warning("telegram_journal_not_saved", error=str(exc), held=len(self._held))

    # -- writing ------------------------------------------------------------------------------------

    async def _save(self) -> None:
        """Write the current state, unless a write that started after our change already did."""
        wanted = self._version
        async with self._lock:
            if self._saved >= wanted:
                return
            await self._write()

    async def _write(self) -> None:
        """Under ``_lock``: one atomic snapshot of everything (held updates in full, done ids)."""
        version = self._version
        text = json.dumps(
            {"bot_id": self._bot_id, "held": list(self._held.values()), "done": list(self._done)}
        )
        await asyncio.to_thread(atomic_write_text, self._path, text + "\n")
        self._saved = max(self._saved, version)

    def _failed_save(self, exc: Exception) -> None:
        if is_storage_error(exc):
            self._outage.failed(exc)
        else:
            log.exception("telegram_journal_save_failed")
        if self._retry is None or self._retry.done():
            self._retry = asyncio.create_task(self._save_later(), name="telegram-journal-retry")

    async def _save_later(self) -> None:
        attempt = 0
        while self._saved < self._version:
            attempt += 1
            await self._outage.pause(self._outage.delay(attempt))
            try:
                await self._save()
            except Exception as exc:
                if is_storage_error(exc):
                    self._outage.failed(exc)
                else:
                    log.exception("telegram_journal_save_failed")
        self._outage.recovered()

    def _update_room(self) -> None:
        if self.full:
            self._room.clear()
        else:
            self._room.set()


def _read(path: Path) -> dict[str, Any]:
    """The journal's content; a damaged file is moved aside (kept for the operator) and logged.

    Within a readable file, a held entry that is not an update, or a *done* list that is not one, costs
    only itself: the entries are kept aside (``bot/damaged.py``) and the rest is used.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    with contextlib.suppress(ValueError):  # UnicodeDecodeError is one too: a byte that is not UTF-8
        data = json.loads(raw.decode("utf-8"))
        if isinstance(data, dict) and isinstance(data.get("held", []), list):
            return _checked(path, data)
    damaged.move_aside(path, raw, event="telegram_journal_damaged")  # named by its bytes: kept apart
    return {}


def _checked(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    held: list[Any] = data.get("held", [])
    done: Any = data.get("done", [])
    bad = [
        damaged.DamagedLine(
            0, json.dumps(u).encode(), f"held[{i}] is not an update with an integer update_id"
        )
        for i, u in enumerate(held)
        if not _is_update(u)
    ]
    if not isinstance(done, list):
        bad.append(damaged.DamagedLine(0, json.dumps({"done": done}).encode(), "done is not a list"))
        done = []
    if bad:
        kept = damaged.set_aside(path, bad)
        reasons = [b.reason for b in bad]
        log.warning("telegram_journal_entries_set_aside", path=str(path), reasons=reasons, kept_in=str(kept))
    return {
        **data,
        "held": [u for u in held if _is_update(u)],
        "done": [i for i in done if isinstance(i, int)],
    }


def _is_update(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("update_id"), int)
