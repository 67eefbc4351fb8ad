"""Delivery of replies: through the channel, with retries, and with the inbox's bookkeeping of each.

A saved answer is sent; once it went out, its inbox entries are done. One the platform does not take
is kept in the inbox (a restart sends it) and sent again, or set aside in its lane to be tried once
before the chat's next answer, so a chat gets its answers in order. Notices and the replies of most
commands go out beside the chat's turn and are never kept; those of /new and /compact are answers
(bot/dispatcher/commands.py). A write the disk refuses (a done mark, the session
save) is written again until it goes through (:meth:`Delivery.persist`), at once when another one
goes through: storage is back, and a pause left to run out would hold the chat for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Literal

import structlog

from bot.config import DispatcherSettings
from bot.dispatcher.lanes import Lane
from bot.domain import InboundMessage, OutboundMessage, utcnow
from bot.errors import ChannelRefused, MessageRefused, StorageError
from bot.inbox import Inbox
from bot.outbox import PendingReply
from bot.ports import ChannelPort
from bot.retry import Backoff, retry

log = structlog.get_logger(__name__)

RETRY = Backoff(2.0, 60.0)  # pauses before sending or writing again after a failure
SEND_PATIENCE = 3600.0  # seconds an unsent answer holds its chat before it waits for the next start
# went out; may go out later; never will as it is (the chat refuses the bot); nor will this message
# (its content), but the chat can be told
Outcome = Literal["sent", "failed", "refused", "rejected"]
# What the chat is told when the platform refused an answer itself (MessageRefused).
REJECTED_NOTICE = (
    "⚠️ My answer could not be delivered: {platform} refused it. Ask me again and I'll put it differently."
)


class Delivery:
    """Sends replies through the attached channels and keeps the inbox's account of them.

    ``channels`` is read at each send, so a channel attached later is found; ``inbox`` is ``None``
    when nothing is kept (tests, ``membot chat`` without state). Call :meth:`begin_shutdown` when the
    bot stops: answers waiting to be sent again stop waiting, and the next start sends them.
    """

    def __init__(
        self,
        channels: Mapping[str, ChannelPort],
        inbox: Inbox | None,
        settings: DispatcherSettings,
        *,
        retry: Backoff = RETRY,
        send_patience: float = SEND_PATIENCE,
    ) -> None:
        self._channels = channels
        self._inbox = inbox
        self._settings = settings
        self._retry = retry
        self._send_patience = send_patience
        self._closing = asyncio.Event()  # set at shutdown: resends stop waiting (the inbox keeps them)
        self._waiting: dict[object, tuple[str, str, str]] = {}  # writes held up by storage: what, why, chat
        # Set, then replaced, when the writes held up by storage should try again at once (one went
        # through, or a shutdown began): each pause waits on the event current when it began.
        self._try_now = asyncio.Event()

    def begin_shutdown(self) -> None:
        self._closing.set()
        self._wake_waiting()

    def _wake_waiting(self) -> None:
        self._try_now.set()
        self._try_now = asyncio.Event()

    async def deliver(self, reply: PendingReply, lane: Lane) -> None:
        """Send a saved answer; once it went out, its inbox entries are done.

        Answers of the chat set aside earlier go first, once each. A platform that refuses the answer
        past the channel's own retries (an outage): it is kept in the inbox, so a restart sends it, and
        sent again here with growing pauses for up to ``send_patience`` while the chat waits, so answers
        keep their order. A platform that refuses it for good (:class:`~bot.errors.ChannelRefused`:
        the user blocked the bot, the chat is gone) would refuse every try: it is kept and set aside at
        once, and the chat's later answers are each tried once, as this one was. One it refuses for its
        content (:class:`~bot.errors.MessageRefused`) would be too, but the chat can be told: it is, in
        plain words, and the answer is done (the history holds it; asked again, the model rewords it).
        A done mark the disk refuses is written again until it goes through: left out, the next start
        would answer twice."""
        inbox = self._inbox
        await self._send_set_aside(lane)
        outcome = await self.send_out(reply.outbound())
        if inbox is None or not reply.entries:
            if outcome == "rejected":
                await self._tell_rejected(reply)
            return
        if outcome in ("failed", "refused"):
            await self.persist("reply_keep", reply.session_id, lambda: inbox.keep(reply))
            if outcome == "failed":
                outcome = await self._resend(reply)
        if outcome == "rejected":  # told, it is done: kept, the same answer would be refused again
            await self._tell_rejected(reply)
        elif outcome != "sent":
            lane.set_aside.append(reply)
            if outcome == "refused":
                where = str(inbox.file(reply.session_id))
                log.warning(
                    "reply_set_aside",
                    channel=reply.channel,
                    chat_id=reply.chat_id,
                    reply_id=reply.id,
                    kept_in=where,
                    tried_again="once before the chat's next answer, and at the next start",
                )
            return
        await self._finish(reply)

    async def _send_set_aside(self, lane: Lane) -> None:
        """Try the chat's set-aside answers once each, oldest first, until one does not go out. One kept
        past ``kept_reply_max_age`` is not tried any more: the inbox moves it to its expired folder."""
        while lane.set_aside:
            reply = lane.set_aside[0]
            if self._inbox is not None and reply.expired(self._settings.kept_reply_max_age, utcnow()):
                await self.persist(
                    "reply_expire", reply.session_id, functools.partial(self._inbox.expire, reply)
                )
                lane.set_aside.pop(0)
                continue
            outcome = await self.send_out(reply.outbound())
            if outcome == "rejected":
                await self._tell_rejected(reply)
            elif outcome != "sent":
                return
            else:
                log.info("reply_sent_late", channel=reply.channel, chat_id=reply.chat_id, reply_id=reply.id)
            lane.set_aside.pop(0)
            await self._finish(reply)

    async def _tell_rejected(self, reply: PendingReply) -> None:
        """The platform refused the answer itself: say so to the chat (the log has its words)."""
        log.warning("reply_rejected", channel=reply.channel, chat_id=reply.chat_id, reply_id=reply.id)
        platform = reply.channel.capitalize()
        out = reply.outbound()
        notice = OutboundMessage(
            out.channel,
            out.chat_id,
            REJECTED_NOTICE.format(platform=platform),
            reply_to=out.reply_to,
            is_error=True,
            aside=True,
        )
        await self.send_out(notice)

    async def _finish(self, reply: PendingReply) -> None:
        if self._inbox is None or not reply.entries:
            return
        inbox, sid = self._inbox, reply.session_id
        await self.persist(
            "inbox_done_mark", sid, lambda: inbox.finish(sid, set(reply.entries), reply=reply.id)
        )

    async def _resend(self, reply: PendingReply) -> Outcome:
        """Send ``reply`` again with growing pauses for up to ``send_patience`` seconds. "refused" or
        "rejected": a refusal for good ends the wait at once; "failed": the patience ran out, or a
        shutdown began."""
        deadline = time.monotonic() + self._send_patience
        attempt = 0
        while time.monotonic() + (pause := self._retry(attempt)) <= deadline:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._closing.wait()
            if self._closing.is_set():  # shutting down: the next start sends it
                return "failed"
            attempt += 1
            outcome = await self.send_out(reply.outbound())
            if outcome == "sent":
                log.info("reply_sent_late", channel=reply.channel, chat_id=reply.chat_id, attempts=attempt)
            if outcome != "failed":
                return outcome
        log.error("reply_kept_for_next_start", channel=reply.channel, chat_id=reply.chat_id, attempts=attempt)
        return "failed"

    async def persist(
        self,
        what: str,
        sid: str,
        write: Callable[[], Awaitable[object]],
        *,
        notice: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``write`` (of chat ``sid``) again with growing pauses while storage refuses it (a full disk
        frees up). A shutdown ends the pause with one more try at once; refused again, the grace
        period's end cancels the wait, and the inbox then has the work for the next start.
        ``notice`` tells the user once, so a chat that waits is not a chat that seems dead; /status
        and /healthz tell of the wait meanwhile (:meth:`storage_wait`, :meth:`storage_waits`).
        A write that goes through while others wait ends their pauses: storage is back, and a chat
        killed while its done mark sat out a pause would be answered again at the next start."""
        try:
            await write()
        except (StorageError, OSError) as exc:
            log.error("storage_write_failed_retrying", what=what, error=str(exc))
            token = object()
            self._waiting[token] = (what, f"{type(exc).__name__}: {exc}", sid)
        else:
            if self._waiting:
                self._wake_waiting()
            return
        tried_at_close = False

        async def pause(delay: float) -> None:
            # A shutdown ends the pause for one more try at once: the disk may be back (its operator
            # freed it, then restarted us), and a done mark missed now has the next start send again.
            # So does another write that went through (:meth:`_wake_waiting`).
            nonlocal tried_at_close
            if self._closing.is_set() and not tried_at_close:
                tried_at_close = True
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._try_now.wait()
            tried_at_close = self._closing.is_set()

        try:
            if notice is not None:
                await notice()
            await pause(self._retry(0))
            await retry(
                write,
                retry_if=lambda exc, _: isinstance(exc, StorageError | OSError),
                wait=lambda _, tries: self._retry(tries),
                sleep=pause,
            )
        finally:
            del self._waiting[token]
        log.info("storage_write_recovered", what=what)
        if self._waiting:
            self._wake_waiting()

    def storage_waits(self) -> dict[str, str]:
        """The writes that wait for storage now (:meth:`persist`), each by what it is for and its chat
        (``"session_save (telegram:42)"``: two chats held at their saves are two), with the error that
        stopped its first try: their chats are held until they go through (/healthz shows them)."""
        return {f"{what} ({sid})": error for what, error, sid in self._waiting.values()}

    def storage_wait(self, sid: str) -> str | None:
        """What of chat ``sid`` waits for storage now (``"session_save"``, ``"inbox_done_mark"``, …)."""
        return next((what for what, _, chat in self._waiting.values() if chat == sid), None)

    async def send(self, to: InboundMessage, text: str, *, error: bool = False) -> None:
        """A command's reply or a notice: beside whatever turn the chat is running."""
        await self.send_out(
            OutboundMessage(to.channel, to.chat_id, text, reply_to=to.message_id, is_error=error, aside=True)
        )

    async def send_out(self, out: OutboundMessage) -> Outcome:
        channel = self._channels.get(out.channel)
        if channel is None:
            log.error("reply_without_channel", channel=out.channel, chat_id=out.chat_id)
            return "failed"
        try:
            await channel.send(out)
        except ChannelRefused as exc:  # no traceback: the platform's answer is the whole story
            # (a user's own setting, such as DMs closed to the bot, is no error of the operator's)
            (log.warning if exc.by_user else log.error)(
                "reply_refused",
                channel=out.channel,
                chat_id=out.chat_id,
                reason=exc.reason,
                fix=exc.fix,
                error=str(exc),
            )
            return "rejected" if isinstance(exc, MessageRefused) and not out.aside else "refused"
        except Exception:
            log.exception("reply_failed", channel=out.channel, chat_id=out.chat_id)
            return "failed"
        return "sent"
