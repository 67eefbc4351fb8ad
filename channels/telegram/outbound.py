"""Delivering replies to Telegram: chunks, fallbacks, retries, pacing, typing and streaming.

A reply is rendered into HTML chunks (:mod:`channels.telegram.format`) and sent one by one:

* a chunk Telegram cannot parse ("can't parse entities") is sent again as plain text; one it finds
  too long (our count and Telegram's disagreeing) is halved and sent as plain text. How far a keyed
  answer got, halves included, is noted (:mod:`channels.telegram.sent`): sent again, after a failure
  or a restart, it goes on from there;
* 429 ``retry_after`` is honoured by PTB's ``AIORateLimiter`` (which also paces 30 msg/s overall and
  20/min per group); timeouts, connection errors and 5xx are retried here with exponential backoff. A
  send that timed out may have gone out all the same (at least once): the channel waits 30 s for
  Telegram's answer, not PTB's 5, so only a request that hangs can be sent twice;
* per chat, a short burst goes out at once, then about one message per second (Telegram's advice);
* what finally fails is logged with the chat id and raised as :class:`~bot.errors.ChannelError`, or
  as :class:`~bot.errors.ChannelRefused` when Telegram refuses the chat for good (the user blocked
  the bot, the bot was removed from the group: :mod:`channels.telegram.refusals`).

``telegram.error`` types are caught here and in :mod:`channels.telegram` only.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import structlog
from aiolimiter import AsyncLimiter
from telegram import Bot, ReplyParameters
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, NetworkError, TelegramError

from bot.domain import OutboundMessage
from bot.errors import ChannelError, ChannelRefused
from bot.retry import Backoff, retry
from channels.base import PartialSink, while_running
from channels.chunking import split_message, utf16_len
from channels.streaming import StreamedMessage
from channels.telegram.format import RenderedChunk, render_chunks
from channels.telegram.refusals import as_channel_error, refuses_for_good
from channels.telegram.sent import Progress, SentChunks, sent_chunks

log = structlog.get_logger(__name__)

T = TypeVar("T")

# Told how far a chunk being sent got, after each of its halves but the last (see ``deliver``).
Went = Callable[[Progress], Awaitable[None]]


def parse_chat(chat_id: str) -> tuple[int, int | None]:
    """``"<chat>"`` or ``"<chat>:<topic>"`` (the channel's chat ids) back to Telegram's ids."""
    chat, _, thread = chat_id.partition(":")
    return int(chat), int(thread) if thread else None


class ChatPacer:
    """Per-chat pacing: ``burst`` messages at once, then one every ``interval`` seconds (Telegram
    allows about one message a second in a chat). One aiolimiter leaky bucket per chat, the library
    PTB's ``AIORateLimiter`` uses for the overall limit."""

    def __init__(self, interval: float, burst: int) -> None:
        self._interval = interval
        self._burst = max(1, burst)
        self._limiters: dict[int, AsyncLimiter] = {}

    async def wait(self, chat: int) -> None:
        if self._interval <= 0:
            return
        limiter = self._limiters.get(chat)
        if limiter is None:
            limiter = self._limiters[chat] = AsyncLimiter(self._burst, self._burst * self._interval)
        await limiter.acquire()


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
        sent: SentChunks | None = None,
    ) -> None:
        self._bot = bot
        self._max_retries = max_retries
        self._retry_base_delay = retry_base_delay
        self._typing_interval = typing_interval
        self._stream_interval = stream_interval
        self._pacer = pacer
        self._monotonic = monotonic
        self._streams: dict[str, StreamedMessage[int, RenderedChunk]] = {}
        self._sent = sent or sent_chunks(None)  # chunks of a keyed answer that went out before a failure

    async def send(self, message: OutboundMessage) -> None:
        """Deliver a whole reply; raises ChannelError (after logging it) if part of it could not go out,
        ChannelRefused if Telegram refuses the chat for good."""
        chat, thread = parse_chat(message.chat_id)
        chunks = render_chunks(message.text) or [RenderedChunk(None, "(empty reply)")]
        in_group = chat < 0  # quote the question in groups only; in a private chat it is noise
        quoted = message.reply_to or ""
        reply_to = int(quoted) if in_group and quoted.isdigit() else None
        stream = None if message.aside else self._streams.pop(message.chat_id, None)
        preview = stream.message if stream is not None else None
        shown = stream.shown if stream is not None and preview is not None else ""
        if preview is None and not message.aside:  # one a kill left in the chat: the answer goes in it
            preview = self._sent.preview(message.chat_id, message.reply_to)
        key = message.key
        went: Went | None = functools.partial(self._sent.record, key) if key else None
        done = self._sent.get(key) if key else ()  # sent again (maybe after a restart): only the rest
        first = done[0] if done else 0
        try:
            for index in range(first, len(chunks)):
                chunk = chunks[index]
                halves = done[1:] if index == first else ()  # of this chunk, those that went out
                edited = False
                if index == 0 and not halves and preview is not None:
                    edited = await self._edit(chat, preview, chunk, shown)
                if not edited:  # also when the streamed message is gone (the user deleted it)
                    to = reply_to if index == 0 else None
                    await self.deliver(chat, thread, chunk, to, skip=halves, went=_inside(went, index))
                if went is not None and index + 1 < len(chunks):
                    await went((index + 1,))
        except TelegramError as exc:
            reason = f"could not deliver a reply to Telegram chat {message.chat_id}: {exc}"
            raise _logged(as_channel_error(reason, exc), message.chat_id, exc) from exc
        if key:
            self._sent.finished(key)
        if not message.aside:
            self._sent.preview_done(message.chat_id, message.reply_to)

    async def send_plain(self, chat: int, text: str) -> None:
        try:
            await self.deliver(chat, None, RenderedChunk(None, text), None)
        except TelegramError as exc:
            raise _logged(
                as_channel_error(f"could not send to Telegram chat {chat}: {exc}", exc), chat, exc
            ) from exc

    async def deliver(
        self,
        chat: int,
        thread: int | None,
        chunk: RenderedChunk,
        reply_to: int | None,
        *,
        skip: Progress = (),
        went: Went | None = None,
    ) -> int:
        """Send one chunk as HTML, falling back to plain text, halved when Telegram finds it too long;
        returns the (last) message id. ``went`` is told how far a halved chunk got after each half but
        the last; given that as ``skip``, a later call sends only the halves not yet sent."""
        if skip:  # it went out halved before, and in part: the rest, halved the same way
            return await self._halves(chat, thread, chunk.plain, None, skip=skip, went=went)
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
            log.warning("telegram_message_too_long", chat_id=chat, length=utf16_len(chunk.plain))
            if len(_halve(chunk.plain)) < 2:
                raise
            return await self._halves(chat, thread, chunk.plain, reply_to, skip=(), went=went)
        return sent.message_id

    async def _halves(
        self,
        chat: int,
        thread: int | None,
        text: str,
        reply_to: int | None,
        *,
        skip: Progress,
        went: Went | None,
    ) -> int:
        """Send ``text`` halved, as plain text, from the half ``skip`` points at on (see ``deliver``)."""
        pieces = _halve(text)
        first = skip[0] if skip else 0
        message_id = 0
        for index in range(first, len(pieces)):
            inner = skip[1:] if index == first else ()
            piece = RenderedChunk(None, pieces[index])
            message_id = await self.deliver(
                chat, thread, piece, reply_to, skip=inner, went=_inside(went, index)
            )
            reply_to = None
            if went is not None and index + 1 < len(pieces):
                await went((index + 1,))
        return message_id

    async def _edit(self, chat: int, message_id: int, chunk: RenderedChunk, shown: str) -> bool:
        """Rewrite a streamed message in place (HTML, else plain text); unchanged text is fine.
        False: the message is gone or can no longer be edited."""
        if (chunk.html or chunk.plain) == shown:
            return True
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
                return True
            except BadRequest as exc:
                said = str(exc).lower()
                if "message is not modified" in said:
                    return True
                if "message to edit not found" in said or "message can't be edited" in said:
                    log.warning("telegram_stream_message_gone", chat_id=chat, error=str(exc))
                    return False
                if mode is None or not _is_parse_error(exc):
                    raise
                log.warning("telegram_html_rejected", chat_id=chat, error=str(exc))
        return True

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

    def stream(self, chat_id: str, reply_to: str | None = None) -> PartialSink:
        """A sink that writes the partial reply into one message, edited at most every interval.

        ``reply_to`` (the message answered) keys the preview on disk: the answer to it goes into the
        preview after a restart too, and a preview a kill left for it is streamed into again."""
        chat, thread = parse_chat(chat_id)

        def first_chunk(text_so_far: str) -> RenderedChunk | None:
            chunks = render_chunks(text_so_far)
            return chunks[0] if chunks else None

        async def post(chunk: RenderedChunk) -> int:
            earlier = self._sent.preview(chat_id, reply_to)
            if earlier is not None and await self._edit(chat, earlier, chunk, ""):
                return earlier
            message_id = await self.deliver(chat, thread, chunk, None)
            await self._sent.record_preview(chat_id, reply_to, message_id)
            return message_id

        async def edit(message_id: int, chunk: RenderedChunk) -> None:
            await self._edit(chat, message_id, chunk, stream.shown)

        def failed(exc: Exception) -> None:  # the final reply still goes out (edited in or sent anew)
            stopped = refuses_for_good(exc)  # then it takes the dispatcher's refused path
            log.warning("telegram_stream_failed", chat_id=chat_id, error=str(exc), stopped=stopped)

        stream = self._streams[chat_id] = StreamedMessage(
            render=first_chunk,
            shown_as=lambda chunk: chunk.html or chunk.plain,
            post=post,
            edit=edit,
            interval=self._stream_interval,
            clock=self._monotonic,
            errors=(TelegramError,),
            on_error=failed,
            keep_trying=True,  # the next partial tries again; the final reply still edits this message
            gives_up=refuses_for_good,  # a blocked user: one refusal, not one every interval all turn
        )
        return stream.show


def _halve(text: str) -> list[str]:
    """``text`` in two (or a few) pieces, cut the same way every time, for a chunk Telegram finds too long."""
    return split_message(text, max(utf16_len(text) // 2, 64), measure=utf16_len)


def _inside(went: Went | None, index: int) -> Went | None:
    """``went`` for the part ``index`` of a whole: how far that part got, behind the parts before it."""
    if went is None:
        return None
    outer = went

    async def inner(progress: Progress) -> None:
        await outer((index, *progress))

    return inner


def _is_parse_error(exc: BadRequest) -> bool:
    return "can't parse entities" in str(exc).lower()


def _is_too_long(exc: BadRequest) -> bool:
    return "message is too long" in str(exc).lower()


def _logged(error: ChannelError, chat: int | str, exc: TelegramError) -> ChannelError:
    """``error``, logged: a warning when the user's own doing refused it (they blocked the bot), which
    the operator need not act on; an error otherwise."""
    if isinstance(error, ChannelRefused) and error.by_user:
        log.warning("telegram_send_refused_by_user", chat_id=chat, reason=error.reason, error=str(exc))
    else:
        log.error("telegram_send_failed", chat_id=chat, error=str(exc))
    return error
