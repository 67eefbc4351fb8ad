"""Delivering replies to Telegram: chunks, fallbacks, retries, pacing, typing and streaming.

A reply is rendered into HTML chunks (:mod:`channels.telegram_format`) and sent one by one:

* a chunk Telegram cannot parse ("can't parse entities") is sent again as plain text; one it finds
  too long (our count and Telegram's disagreeing) is halved and sent as plain text;
* 429 ``retry_after`` is honoured by PTB's ``AIORateLimiter`` (which also paces 30 msg/s overall and
  20/min per group); timeouts, connection errors and 5xx are retried here with exponential backoff;
* per chat, a short burst goes out at once, then about one message per second (Telegram's advice);
* what finally fails is logged with the chat id and raised as :class:`~bot.errors.ChannelError`.

``telegram.error`` types are caught here and in :mod:`channels.telegram` only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
from telegram import Bot, ReplyParameters
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, NetworkError, TelegramError

from bot.domain import OutboundMessage
from bot.errors import ChannelError
from bot.retry import Backoff, retry
from channels.base import PartialSink, while_running
from channels.chunking import split_message, utf16_len
from channels.telegram_format import RenderedChunk, render_chunks

log = structlog.get_logger(__name__)

T = TypeVar("T")


def parse_chat(chat_id: str) -> tuple[int, int | None]:
    """``"<chat>"`` or ``"<chat>:<topic>"`` (the channel's chat ids) back to Telegram's ids."""
    chat, _, thread = chat_id.partition(":")
    return int(chat), int(thread) if thread else None


@dataclass(slots=True)
class _Stream:
    """The message a streamed reply is being written into."""

    message_id: int | None = None
    shown: str = ""
    last_edit: float = 0.0


class ChatPacer:
    """Per-chat token bucket: ``burst`` messages at once, then one every ``interval`` seconds."""

    def __init__(self, interval: float, burst: int, monotonic: Callable[[], float]) -> None:
        self._interval = interval
        self._burst = burst
        self._monotonic = monotonic
        self._buckets: dict[int, tuple[float, float]] = {}  # chat -> (tokens, at)
        self._locks: dict[int, asyncio.Lock] = {}

    async def wait(self, chat: int) -> None:
        if self._interval <= 0:
            return
        async with self._locks.setdefault(chat, asyncio.Lock()):
            now = self._monotonic()
            tokens, at = self._buckets.get(chat, (float(self._burst), now))
            tokens = min(float(self._burst), tokens + (now - at) / self._interval)
            if tokens < 1:
                await asyncio.sleep((1 - tokens) * self._interval)
                now, tokens = self._monotonic(), 1.0
            self._buckets[chat] = (tokens - 1, now)


class TelegramOutbox:
    """Everything the channel sends, over one PTB ``Bot`` (see the module doc)."""

    def __init__(
        self,
        bot: Bot,
        *,
        max_retries: int,
        retry_base_delay: float,
        typing_interval: float,
        stream_interval: float,
        pacer: ChatPacer,
        monotonic: Callable[[], float],
    ) -> None:
        self._bot = bot
        self._max_retries = max_retries
        self._retry_base_delay = retry_base_delay
        self._typing_interval = typing_interval
        self._stream_interval = stream_interval
        self._pacer = pacer
        self._monotonic = monotonic
        self._streams: dict[str, _Stream] = {}

    async def send(self, message: OutboundMessage) -> None:
        """Deliver a whole reply; raises ChannelError (after logging it) if part of it could not go out."""
        chat, thread = parse_chat(message.chat_id)
        chunks = render_chunks(message.text) or [RenderedChunk(None, "(empty reply)")]
        in_group = chat < 0  # quote the question in groups only; in a private chat it is noise
        quoted = message.reply_to or ""
        reply_to = int(quoted) if in_group and quoted.isdigit() else None
        stream = self._streams.pop(message.chat_id, None)
        try:
            for index, chunk in enumerate(chunks):
                if index == 0 and stream is not None and stream.message_id is not None:
                    await self._edit(chat, stream.message_id, chunk, stream.shown)
                else:
                    await self.deliver(chat, thread, chunk, reply_to if index == 0 else None)
        except TelegramError as exc:
            log.error("telegram_send_failed", chat_id=message.chat_id, error=str(exc))
            reason = f"could not deliver a reply to Telegram chat {message.chat_id}: {exc}"
            raise ChannelError(reason) from exc

    async def send_plain(self, chat: int, text: str) -> None:
        try:
            await self.deliver(chat, None, RenderedChunk(None, text), None)
        except TelegramError as exc:
            log.error("telegram_send_failed", chat_id=chat, error=str(exc))
            raise ChannelError(f"could not send to Telegram chat {chat}: {exc}") from exc

    async def deliver(self, chat: int, thread: int | None, chunk: RenderedChunk, reply_to: int | None) -> int:
        """Send one chunk as HTML, falling back to plain text; returns the message id."""
        extra: dict[str, Any] = {"message_thread_id": thread}
        if reply_to is not None:
            extra["reply_parameters"] = ReplyParameters(reply_to, allow_sending_without_reply=True)
        await self._pacer.wait(chat)
        if chunk.html is not None:
            html = chunk.html
            try:
                sent = await self.call(
                    lambda: self._bot.send_message(chat, html, parse_mode=ParseMode.HTML, **extra),
                    what="sendMessage",
                    chat=chat,
                )
                return sent.message_id
            except BadRequest as exc:
                if not _is_parse_error(exc) and not _is_too_long(exc):
                    raise
                log.warning("telegram_html_rejected", chat_id=chat, error=str(exc))
        try:
            sent = await self.call(
                lambda: self._bot.send_message(chat, chunk.plain, **extra), what="sendMessage", chat=chat
            )
        except BadRequest as exc:
            if not _is_too_long(exc):
                raise
            pieces = split_message(chunk.plain, max(utf16_len(chunk.plain) // 2, 64), measure=utf16_len)
            log.warning("telegram_message_too_long", chat_id=chat, length=utf16_len(chunk.plain))
            if len(pieces) < 2:
                raise
            message_id = 0
            for piece in pieces:
                message_id = await self.deliver(chat, thread, RenderedChunk(None, piece), reply_to)
                reply_to = None
            return message_id
        return sent.message_id

    async def _edit(self, chat: int, message_id: int, chunk: RenderedChunk, shown: str) -> None:
        """Rewrite a streamed message in place (HTML, else plain text); unchanged text is fine."""
        if (chunk.html or chunk.plain) == shown:
            return
        attempts: list[tuple[str, ParseMode | None]] = [(chunk.plain, None)]
        if chunk.html is not None:
            attempts.insert(0, (chunk.html, ParseMode.HTML))
        for text, mode in attempts:
            try:
                await self.call(
                    lambda: self._bot.edit_message_text(text, chat, message_id, parse_mode=mode),  # noqa: B023
                    what="editMessageText",
                    chat=chat,
                )
                return
            except BadRequest as exc:
                if "message is not modified" in str(exc).lower():
                    return
                if mode is None or not _is_parse_error(exc):
                    raise
                log.warning("telegram_html_rejected", chat_id=chat, error=str(exc))

    async def call(self, request: Callable[[], Awaitable[T]], *, what: str, chat: int | None = None) -> T:
        """Run one Bot API request, retrying timeouts, connection failures and 5xx with backoff."""
        backoff = Backoff(self._retry_base_delay, 30.0)

        def transient(exc: Exception) -> bool:  # TimedOut, connection errors and every 5xx; not BadRequest
            return isinstance(exc, NetworkError) and not isinstance(exc, BadRequest)

        def note(exc: Exception, tried: int, delay: float) -> None:
            log.warning("telegram_retry", wait=delay, what=what, chat_id=chat, attempt=tried, error=str(exc))

        try:
            return await retry(
                request,
                retry_if=lambda exc, attempt: transient(exc) and attempt <= self._max_retries,
                wait=lambda exc, attempt: backoff(attempt - 1),
                on_retry=note,
            )
        except NetworkError as exc:
            if transient(exc):
                attempt = self._max_retries + 1
                log.error("telegram_request_failed", what=what, chat_id=chat, attempt=attempt, error=str(exc))
            raise

    # -- while a turn runs ----------------------------------------------------------------------------

    def typing(self, chat_id: str) -> AbstractAsyncContextManager[None]:
        """Show "typing…" until the block ends (Telegram shows it ~5 s per call, so it is repeated)."""
        return while_running(self._keep_typing(chat_id), name=f"telegram-typing:{chat_id}")

    async def _keep_typing(self, chat_id: str) -> None:
        chat, thread = parse_chat(chat_id)
        while True:
            try:
                await self._bot.send_chat_action(chat, ChatAction.TYPING, message_thread_id=thread)
            except TelegramError as exc:  # cosmetic: never worth failing or retrying a turn for
                log.debug("telegram_typing_failed", chat_id=chat_id, error=str(exc))
            await asyncio.sleep(self._typing_interval)

    def stream(self, chat_id: str) -> PartialSink:
        """A sink that writes the partial reply into one message, edited at most every interval."""
        stream = self._streams[chat_id] = _Stream()
        chat, thread = parse_chat(chat_id)

        async def show(text_so_far: str) -> None:
            now = self._monotonic()
            if stream.message_id is not None and now - stream.last_edit < self._stream_interval:
                return  # throttled: the final reply edits the message anyway
            chunks = render_chunks(text_so_far)
            if not chunks:
                return
            stream.last_edit = now
            try:
                if stream.message_id is None:
                    stream.message_id = await self.deliver(chat, thread, chunks[0], None)
                else:
                    await self._edit(chat, stream.message_id, chunks[0], stream.shown)
                stream.shown = chunks[0].html or chunks[0].plain
            except TelegramError as exc:  # streaming is best effort; the final reply still goes out
                log.warning("telegram_stream_failed", chat_id=chat_id, error=str(exc))

        return show


def _is_parse_error(exc: BadRequest) -> bool:
    return "can't parse entities" in str(exc).lower()


def _is_too_long(exc: BadRequest) -> bool:
    return "message is too long" in str(exc).lower()
