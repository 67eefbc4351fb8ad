"""Inbound Telegram text: joining a paste the client split up.

Telegram clients split a long paste into several messages sent within a second; :class:`PasteJoiner`
puts them back together so the model sees one question, not four. Whether a message is meant for this
bot at all is decided before, in :mod:`channels.telegram.addressing`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Coroutine
from typing import Any

import structlog

from bot.domain import InboundMessage
from channels.base import InboundSink
from channels.chat_locks import ChatLocks
from channels.outage import StorageOutage, is_storage_error

log = structlog.get_logger(__name__)


class NotTaken(Exception):
    """The joiner stopped before ``submit`` took the message: it stays in the channel's journal."""


class PasteJoiner:
    """Hands messages to ``submit``, joining those from one sender in one chat that arrive close together.

    ``add`` returns a future that completes when the (joined) message was submitted, so the channel can
    release the update from its journal only once the dispatcher has it. Each new message restarts the
    sender's window; ``window <= 0`` submits at once. Text longer than ``max_chars`` is truncated with a
    note. Messages of one chat are submitted in order, one at a time.

    When ``submit`` fails for lack of storage (a full disk), the message is submitted again with
    ``outage``'s backoff until it is taken, and the chat's later messages wait behind it; the outage is
    logged once. Any other failure is tried ``max_attempts`` times and then given up (the future has
    that error). After :meth:`close` a failed try is not repeated: the future gets :class:`NotTaken`.
    """

    def __init__(
        self,
        submit: InboundSink,
        window: float,
        *,
        max_chars: int,
        outage: StorageOutage | None = None,
        max_attempts: int = 3,
    ) -> None:
        self._submit = submit
        self._window = window
        self._max_chars = max_chars
        self._outage = outage or StorageOutage("handing Telegram messages to the dispatcher")
        self._max_attempts = max_attempts
        self._pending: dict[tuple[str, str], _Batch] = {}
        self._chats = ChatLocks()  # submits of one chat, in order
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = asyncio.Event()

    def add(self, message: InboundMessage, *, alone: bool = False) -> asyncio.Future[None]:
        """Queue ``message`` for joining; ``alone`` (commands) submits it at once and by itself,
        right after whatever the sender had waiting."""
        key = (message.chat_id, message.sender_id)
        if alone:
            previous = self._take(key)
            batch = _Batch([message])
            self._start(self._send_in_order([b for b in (previous, batch) if b is not None]))
            return batch.done
        batch = self._pending.setdefault(key, _Batch())
        batch.messages.append(message)
        if batch.timer is not None:
            batch.timer.cancel()
        if self._window <= 0:
            del self._pending[key]
            self._start(self._send(batch))
        else:
            batch.timer = self._start(self._flush_later(key))
        return batch.done

    def cut(self) -> None:
        """Hand on what waits now, without waiting for its window: later messages are not joined to it."""
        for key in list(self._pending):
            batch = self._take(key)
            assert batch is not None
            self._start(self._send(batch))

    def _take(self, key: tuple[str, str]) -> _Batch | None:
        """The sender's waiting batch, out of the queue and its window's timer stopped."""
        batch = self._pending.pop(key, None)
        if batch is not None and batch.timer is not None:
            batch.timer.cancel()
        return batch

    async def flush(self, key: tuple[str, str]) -> None:
        """Submit what ``key`` has waiting now."""
        batch = self._pending.pop(key, None)
        if batch is not None:
            await self._send(batch)

    async def _send_in_order(self, batches: list[_Batch]) -> None:
        for batch in batches:
            await self._send(batch)

    async def _send(self, batch: _Batch) -> None:
        message = self._joined(batch.messages)
        try:
            async with self._chats.hold(message.chat_id):
                await self._submit_until_taken(message)
        except BaseException as exc:
            if not batch.done.done():
                batch.done.set_exception(exc)
                batch.done.exception()  # marked retrieved: the channel may be stopping and not await it
            if not isinstance(exc, Exception):
                raise
        else:
            if not batch.done.done():
                batch.done.set_result(None)

    async def _submit_until_taken(self, message: InboundMessage) -> None:
        holder = object()  # in the outage the hand-over's lanes share: this submit's failures
        try:
            await self._submit_with_retries(message, holder)
        finally:
            self._outage.given_up(holder)

    async def _submit_with_retries(self, message: InboundMessage, holder: object) -> None:
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._submit(message)
            except Exception as exc:
                storage = is_storage_error(exc)
                if storage:
                    self._outage.failed(exc, holder)
                else:
                    log.exception("telegram_submit_failed", chat_id=message.chat_id, attempt=attempt)
                if self._closing.is_set():
                    raise NotTaken(f"not taken before the channel stopped: {exc}") from exc
                if not storage and attempt >= self._max_attempts:
                    raise
                # close() cuts the pause short, as a write that goes through meanwhile does
                await self._outage.pause(self._outage.delay(attempt))
                continue
            self._outage.recovered(holder)
            return

    async def close(self) -> None:
        """Submit everything still waiting, once (shutdown must not drop a paste in its join window);
        stop retrying what storage refuses (it stays in the journal for the next start)."""
        self._closing.set()
        self._outage.wake()  # the submits waiting for storage try once more, then stop
        for batch in self._pending.values():
            if batch.timer is not None:
                batch.timer.cancel()
        for key in list(self._pending):
            await self.flush(key)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _flush_later(self, key: tuple[str, str]) -> None:
        await asyncio.sleep(self._window)
        batch = self._pending.get(key)
        if batch is not None:
            batch.timer = None  # flush() must not cancel the task it runs in
        await self.flush(key)

    def _start(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _joined(self, messages: list[InboundMessage]) -> InboundMessage:
        first = messages[0]
        text = "\n".join(m.text for m in messages if m.text)
        if len(text) > self._max_chars:
            note = f"\n\n[message truncated: {len(text)} characters, limit {self._max_chars}]"
            text = text[: self._max_chars] + note
        attachments = tuple(a for m in messages for a in m.attachments)
        joined = tuple(i for m in messages[1:] for i in (m.message_id, *m.joined) if i)
        return dataclasses.replace(first, text=text, attachments=attachments, joined=first.joined + joined)


@dataclasses.dataclass(slots=True)
class _Batch:
    messages: list[InboundMessage] = dataclasses.field(default_factory=list)
    timer: asyncio.Task[None] | None = None
    done: asyncio.Future[None] = dataclasses.field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
