"""A chat's messages as they arrive: a command to its handling, a message taken once, durably, into its lane.

Each message is cut to the longest a chat may send (bot/intake.py). A command goes to
bot/dispatcher/commands.py. A message is dropped when the platform hands it over again (still pending
in the inbox, or noted in its session as taken), else it is appended to the inbox and only then queued
in its chat's lane, in the order of arrival; a flood past ``dispatcher.queue_limit`` is folded behind
the newest queued message, never dropped, and the chat is told once. While the dispatcher shuts down,
what arrives stays in the inbox for the next start and the chat is told so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from bot import intake
from bot.commands import CommandRouter
from bot.config import DispatcherSettings
from bot.dispatcher.commands import Commands
from bot.dispatcher.delivery import Delivery
from bot.dispatcher.durable import through_cancel
from bot.dispatcher.lanes import Lane, Queued, queued_count
from bot.domain import InboundMessage
from bot.errors import StorageError
from bot.inbox import Inbox
from bot.session_service import SessionService
from pipeline import Pipeline

log = structlog.get_logger(__name__)


class Arrivals:
    """Takes the dispatcher's inbound messages in (:meth:`submit`).

    The dispatcher composes it, as it does :class:`~bot.dispatcher.commands.Commands`: ``lane`` returns a
    chat's lane (made if new: ``sid``, channel, chat id) and ``wake`` starts a lane's worker once its
    channel is ready. The dispatcher sets ``accepting`` to ``False`` when it starts to shut down.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        sessions: SessionService,
        router: CommandRouter,
        commands: Commands,
        delivery: Delivery,
        settings: DispatcherSettings,
        lane: Callable[[str, str, str], Lane],
        wake: Callable[[str, Lane], None],
        *,
        inbox: Inbox | None,
        max_inbound_chars: int,
    ) -> None:
        self._pipeline = pipeline
        self._sessions = sessions
        self._router = router
        self._commands = commands
        self._delivery = delivery
        self._settings = settings
        self._lane = lane
        self._wake = wake
        self._inbox = inbox
        self._max_chars = max_inbound_chars
        self.accepting = True

    async def submit(self, message: InboundMessage) -> None:
        """See :meth:`Dispatcher.submit <bot.dispatcher.Dispatcher.submit>`."""
        message = intake.bounded(message, self._max_chars)
        call = self._router.parse(message)
        if call is not None:
            if not self.accepting:
                await self._delivery.send(
                    message, "I'm restarting — please send that command again in a minute."
                )
                return
            await self._commands.submit(call)
            return
        lane = self._lane(message.session_id, message.channel, message.chat_id)
        async with lane.intake:  # one at a time per session, so the order of arrival is kept
            if await self._seen(message):
                log.info(
                    "duplicate_message_ignored", session_id=message.session_id, message_id=message.message_id
                )
                return
            entry_id, durable = self._inbox.add(message) if self._inbox else (None, None)
            cancelled: asyncio.CancelledError | None = None
            if durable is not None:
                # On disk before it is queued: a message that could not be stored is never answered
                # (the channel does not confirm it, and the platform's redelivery is taken as new).
                # Only this session's later messages wait here, and they would wait for its inbox file.
                cancelled = await through_cancel(durable)
            if self.accepting and not lane.queue and (lane.turn is None or self._settings.mode != "collect"):
                # It will be a turn of its own: its systems may start on it while the turn is set up. (In
                # collect mode, one that arrives during a turn may be answered together with the next.)
                self._pipeline.anticipate(message)
            queued = Queued(message, [entry_id] if entry_id else [])
            notice = self._enqueue(message.session_id, lane, queued) if self.accepting else None
        if cancelled is not None:
            if notice is not None:  # not sent after all: a later message of the flood says it
                notice.close()
                lane.overflow_noticed = False
            raise cancelled
        if not self.accepting:
            # Shutting down: the inbox keeps it and the next start answers it.
            await self._delivery.send(message, "I'm restarting — I'll answer this as soon as I'm back.")
        elif notice is not None:
            await notice

    async def _seen(self, message: InboundMessage) -> bool:
        """Whether this platform message was accepted before (still pending, or already answered). A
        joined message is, when each message joined in was; with one new part it is answered whole
        (its known parts again), rather than dropped with the new part."""
        if message.message_id is None:
            return False
        sid = message.session_id
        ids = [message.message_id, *message.joined]
        if self._inbox is not None:
            ids = [i for i in ids if not self._inbox.holds(sid, i)]
        if not ids:
            return True
        try:
            session = await self._sessions.get(sid)
        except StorageError:
            return False
        return session is not None and all(intake.taken_before(session, i) for i in ids)

    def _enqueue(self, sid: str, lane: Lane, queued: Queued) -> Coroutine[Any, Any, None] | None:
        """Queue without awaiting (so arrival order is kept); returns the overflow notice to await."""
        notice: Coroutine[Any, Any, None] | None = None
        last = lane.queue[-1] if lane.queue else None
        if len(lane.queue) >= self._settings.queue_limit and isinstance(last, Queued) and not last.in_session:
            # Never drop: fold the overflow behind the newest queued message (answered in its turn, each
            # still its own message: a group member's words stay theirs) and tell the user once.
            last.folded.append(queued)
            if not lane.overflow_noticed:
                lane.overflow_noticed = True
                notice = self._delivery.send(
                    queued.message,
                    f"I'm still on your earlier messages ({queued_count(lane)} waiting). "
                    "I'll read everything you send together when I'm done — nothing is lost.",
                )
        else:
            lane.queue.append(queued)
        if lane.model_wait is not None:  # it joins the waiting messages, and they are tried now
            lane.model_wait.wake()
        self._wake(sid, lane)
        return notice
