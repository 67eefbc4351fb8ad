"""Long polling that confirms a Telegram update only once membot has stored it.

``getUpdates(offset=N)`` tells Telegram that every update below ``N`` was handled, and Telegram then
forgets them. PTB's ``Updater`` moves the offset on as soon as it has *fetched* a batch, so a crash or
kill between fetching and storing loses those messages. :class:`UpdatePoller` hands each batch to
``accept`` (the channel's :class:`~channels.telegram.journal.UpdateJournal`, which returns once the
updates are on disk) and only then asks for the next batch with the offset past it: that request is
the confirmation. A batch that could not be stored is not confirmed; the poller fetches it again after
a backoff (doubling, at most ``max_backoff``), and Telegram keeps it meanwhile.

Confirmation never waits for the paste-join window or the dispatcher: what is in the journal is safe,
so the poller always long-polls, and a chat that keeps typing holds back nobody. An update PTB cannot
parse is fetched alone and raw (:func:`fetch_raw`) and set aside, so it cannot stop polling.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

import structlog
from telegram import Bot, Update
from telegram.error import InvalidToken, RetryAfter, TelegramError
from telegram.warnings import PTBUserWarning

from channels.outage import is_storage_error

log = structlog.get_logger(__name__)
_RAW_GET_UPDATES = r"Please use 'Bot\.getUpdates' instead of 'Bot\.do_api_request"
warnings.filterwarnings("ignore", message=_RAW_GET_UPDATES, category=PTBUserWarning)

ALLOWED_UPDATES = ["message"]
"""The update kinds asked for, by polling and by the webhook (``setWebhook``): only new messages."""


Fetch = Callable[[int | None, int], Awaitable[Sequence[Update]]]
"""``(offset, timeout seconds)`` → the updates from ``offset`` on (``Bot.get_updates``)."""

Accept = Callable[[Sequence[Update]], Awaitable[object]]
"""Stores a batch durably (returns once it is on disk) or raises; it logs storage outages itself."""

FetchOne = Callable[[int | None], Awaitable[tuple[int, Update | None] | None]]
"""``offset`` → the first update from ``offset`` on as its id and its parse (``None``: it cannot be
read), fetched raw; ``None`` when there is none."""


class UpdatePoller:
    """Runs ``getUpdates`` until cancelled; :meth:`confirm` on shutdown tells Telegram what was stored.

    Args:
        fetch: one ``getUpdates`` call.
        accept: stores one batch (see :data:`Accept`).
        timeout: long-poll timeout in seconds.
        on_error: told about each failed poll (health, logs); polling goes on with backoff.
        on_recovered: told when a poll succeeds after failed ones.
        room: waited for before each poll, so a full journal stops fetching (Telegram keeps the rest).
        storage_backoff: the pause before fetching again after the n-th batch in a row could not be stored.
        max_backoff: the longest pause after failed polls.
        fetch_one: fetches one update raw (see :data:`FetchOne`). When a batch cannot be read (python-
            telegram-bot refuses an update, say a date past the year 9999) the updates are then taken
            one at a time and the unreadable one is set aside: otherwise it would stop polling for every
            chat, after every restart.
    """

    def __init__(
        self,
        fetch: Fetch,
        accept: Accept,
        *,
        timeout: int,
        on_error: Callable[[TelegramError], None],
        room: Callable[[], Awaitable[None]] | None = None,
        storage_backoff: Callable[[int], float] = lambda n: min(30.0, 0.5 * 2 ** (n - 1)),
        max_backoff: float = 30.0,
        fetch_one: FetchOne | None = None,
        on_recovered: Callable[[], None] | None = None,
    ) -> None:
        self._fetch_one = fetch_one
        self._on_recovered = on_recovered
        self._fetch = fetch
        self._accept = accept
        self._timeout = timeout
        self._on_error = on_error
        self._room = room
        self._storage_backoff = storage_backoff
        self._max_backoff = max_backoff
        self._next: int | None = None  # one past the newest update stored: the confirming offset

    @property
    def offset(self) -> int | None:
        """The offset that confirms exactly the updates stored so far."""
        return self._next

    async def run(self) -> None:
        errors = 0
        unstored = 0
        while True:
            if self._room is not None:
                await self._room()
            try:
                updates = await self._fetch(self._next, self._timeout)
            except InvalidToken:
                log.error("telegram_polling_stopped", reason="the bot token was revoked")
                raise
            except TelegramError as exc:
                self._on_error(exc)
                errors += 1
                await asyncio.sleep(_pause(exc, errors, self._max_backoff))
                continue
            except Exception:
                log.exception("telegram_updates_unreadable", offset=self._next)
                errors += 1
                if not await self._step_past_unreadable():
                    await asyncio.sleep(float(min(self._max_backoff, 2 ** (errors - 1))))
                continue
            if errors and self._on_recovered is not None:
                self._on_recovered()
            errors = 0
            if not updates:
                continue
            try:
                await self._accept(updates)
            except Exception as exc:
                if not is_storage_error(exc):
                    log.exception("telegram_updates_not_stored", first=updates[0].update_id)
                unstored += 1
                await asyncio.sleep(self._storage_backoff(unstored))
                continue  # not confirmed: the next poll asks for the same updates again
            unstored = 0
            self._next = max(u.update_id for u in updates) + 1

    async def _step_past_unreadable(self) -> bool:
        """Take the next update alone: stored if it can be read, set aside if not. False: no progress."""
        if self._fetch_one is None:
            return False
        try:
            found = await self._fetch_one(self._next)
            if found is None:
                return False
            update_id, update = found
            if update is not None:
                await self._accept([update])
            else:  # its sender's message is lost: say so where the operator looks
                log.error(
                    "telegram_update_set_aside",
                    update_id=update_id,
                    reason="python-telegram-bot cannot read it",
                )
        except Exception:
            log.exception("telegram_update_not_taken", offset=self._next)
            return False
        self._next = update_id + 1
        return True

    async def confirm(self) -> None:
        """Tell Telegram which updates were stored, so the next start does not fetch them again."""
        if self._next is None:
            return
        try:
            await self._fetch(self._next, 0)
        except TelegramError as exc:
            log.warning("telegram_confirm_failed", error=str(exc))


async def fetch_raw(bot: Bot, offset: int | None) -> tuple[int, Update | None] | None:
    """The first update from ``offset`` on, raw, and its parse (None when PTB cannot read it).

    A :data:`FetchOne`. Raw through ``do_api_request``, since ``get_updates`` parses before it returns;
    PTB's warning that ``get_updates`` exists is silenced process-wide by the filter this module
    installs when imported (:data:`_RAW_GET_UPDATES`)."""
    found = await bot.do_api_request(
        "getUpdates",
        api_kwargs={
            "offset": offset,
            "limit": 1,
            "timeout": 0,
            "allowed_updates": list(ALLOWED_UPDATES),
        },
    )
    if not isinstance(found, list) or not found or not isinstance(found[0], dict):
        return None
    raw = found[0]
    try:
        return int(raw["update_id"]), Update.de_json(raw, bot)
    except (KeyError, TypeError, ValueError):
        return (int(raw["update_id"]), None) if isinstance(raw.get("update_id"), int) else None


def _pause(exc: TelegramError, errors: int, cap: float) -> float:
    if isinstance(exc, RetryAfter):
        after = exc.retry_after
        return after.total_seconds() if isinstance(after, timedelta) else float(after)
    return float(min(cap, 2 ** (errors - 1)))
