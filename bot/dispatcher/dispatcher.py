"""The dispatcher: the hand-off point between channels and the pipeline, and what commands may do.

It takes each inbound message in through bot/dispatcher/arrivals.py (dedup, the inbox, the chat's
lane), which hands commands to bot/dispatcher/commands.py (answered at once beside the chat's turn, or
in their place in its lane); it replays at start what a previous run accepted, and drains the lanes at
shutdown. The lanes' work runs in bot/dispatcher/turns.py, and answers go out through
bot/dispatcher/delivery.py.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from datetime import datetime

import structlog

from bot import intake, recovery
from bot.commands import CommandRouter
from bot.config import DispatcherSettings
from bot.dispatcher.arrivals import Arrivals
from bot.dispatcher.commands import Commands
from bot.dispatcher.delivery import RETRY, SEND_PATIENCE, Delivery
from bot.dispatcher.lanes import (
    Command,
    KeptCommand,
    Lane,
    Queued,
    Stop,
    answer_final,
    queued_count,
    take_messages,
)
from bot.dispatcher.turns import TurnObserver, Turns
from bot.domain import InboundMessage, utcnow
from bot.errors import StorageError
from bot.inbox import Inbox
from bot.model_wait import WaitRecords
from bot.ports import ChannelPort
from bot.retry import Backoff
from bot.session_service import SessionService
from pipeline import Pipeline

log = structlog.get_logger(__name__)

WAIT_LOOK = 0.1  # seconds between looks whether a lane only waits for the model (``settled``)


class Dispatcher:
    """The hand-off point between channels and the pipeline (see the package doc, bot/dispatcher/__init__.py).

    ``submit`` returns once the message is durably queued, which is when a channel may acknowledge it.
    ``redelivery_window``: the most messages of a chat a channel may hand over again (Discord's
    catch-up), so many of the messages taken and commands run in a session are noted there
    (bot/intake.py). ``clock``: the machine's, which dates the chats' messages (tests step it back).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        sessions: SessionService,
        commands: CommandRouter,
        settings: DispatcherSettings,
        *,
        inbox: Inbox | None = None,
        max_inbound_chars: int = 16000,
        observer: TurnObserver | None = None,
        retry: Backoff = RETRY,
        send_patience: float = SEND_PATIENCE,
        waits: WaitRecords | None = None,
        redelivery_window: int = intake.COMMANDS_NOTED,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._sessions = sessions
        self._router = commands
        self._settings = settings
        self._inbox = inbox
        self._waits = waits  # the chats waiting for the model, as a restart finds them
        self._channels: dict[str, ChannelPort] = {}
        self._ready: set[str] = set()
        self._lanes: dict[str, Lane] = {}
        self._delivery = Delivery(self._channels, inbox, settings, retry=retry, send_patience=send_patience)
        self._commands = Commands(
            commands,
            self,
            sessions,
            self._delivery,
            self._lanes,
            self._lane,
            self._wake,
            inbox=inbox,
            noted=redelivery_window,
        )
        self._arrivals = Arrivals(
            pipeline,
            sessions,
            commands,
            self._commands,
            self._delivery,
            settings,
            self._lane,
            self._wake,
            inbox=inbox,
            max_inbound_chars=max_inbound_chars,
        )
        self._turns = Turns(
            pipeline,
            sessions,
            settings,
            self._channels,
            self._delivery,
            self._commands.run_kept,
            inbox=inbox,
            waits=waits,
            observer=observer,
            noted=redelivery_window,
            clock=clock,
        )

    @property
    def turns_completed(self) -> int:
        """Finished turns since start (tests and operators wait on it)."""
        return self._turns.completed

    # -- wiring -----------------------------------------------------------------------------------

    def attach(self, channel: ChannelPort, *, ready: bool = True) -> None:
        """Route replies for ``channel.name`` to ``channel``; with ``ready=False`` its chats' turns wait
        for :meth:`ready` (call that once the channel started and can send)."""
        self._channels[channel.name] = channel
        if ready:
            self.ready(channel.name)

    def ready(self, name: str) -> None:
        """Run the turns of ``name``'s chats from now on, recovered work first."""
        self._ready.add(name)
        for sid, lane in self._lanes.items():
            if lane.channel == name and lane.queue:
                self._start_worker(sid, lane)

    # -- intake -----------------------------------------------------------------------------------

    async def submit(self, message: InboundMessage) -> None:
        """Accept a message: answer a command at once, otherwise queue it (durably) for its session.

        Returns once the message is in the inbox on disk: then the channel may confirm it to the
        platform. A platform message already accepted (a redelivery after a crash) is ignored. A
        cancel that comes once the inbox took the message is raised once the message is queued.
        """
        await self._arrivals.submit(message)

    async def recover(self) -> int:
        """Queue the work that finishes what a previous run accepted (bot/recovery.py); returns how
        many messages that is. Call it before any channel takes messages; each chat's work runs once
        its channel is ready, before anything that arrives later."""
        if self._inbox is None:
            return 0
        planned = await recovery.recover(
            self._inbox,
            self._sessions,
            max_age=self._settings.recover_max_age,
            kept_max_age=self._settings.kept_reply_max_age,
        )
        records = await self._waits.load() if self._waits is not None else {}
        for sid, work in planned.items():
            first = work[0]
            lane = self._lane(sid, first.channel, first.chat_id)
            answered: set[str] = set()
            for item in work:
                last = lane.queue[-1] if lane.queue else None
                if not isinstance(item, recovery.Answer):
                    lane.queue.append(item)
                elif (call := self._router.parse(item.message)) is not None:
                    lane.queue.append(KeptCommand(call, item.entry_id))  # it waited for a turn
                elif item.in_session and isinstance(last, Queued) and last.in_session:
                    # Both stored unanswered by the turn a shutdown cut short (or a try the model
                    # missed): one turn answers them, as that turn would have, in per_message mode too.
                    last.folded.append(Queued(item.message, [item.entry_id], in_session=True))
                    answered.add(item.entry_id)
                else:
                    lane.queue.append(Queued(item.message, [item.entry_id], in_session=item.in_session))
                    answered.add(item.entry_id)
            record = records.pop(sid, None)
            if record is not None and answered & record.entries:
                lane.model_wait = record.resumed()  # the same wait goes on: the chat was told already
            elif record is not None:
                records[sid] = record
            self._wake(sid, lane)
        for sid in records:  # waits whose messages were answered (or are not to be) before the last stop
            assert self._waits is not None
            await self._waits.end(sid)
        return sum(len(w) for w in planned.values())

    def _lane(self, sid: str, channel: str, chat_id: str) -> Lane:
        lane = self._lanes.get(sid)
        if lane is None:
            lane = self._lanes[sid] = Lane(channel, chat_id)
        return lane

    def _wake(self, sid: str, lane: Lane) -> None:
        """Start the lane's worker if its channel is ready (else :meth:`ready` starts it)."""
        if lane.channel in self._ready:
            self._start_worker(sid, lane)

    def _start_worker(self, sid: str, lane: Lane) -> None:
        if lane.worker is None or lane.worker.done():
            lane.worker = asyncio.create_task(self._turns.work(sid, lane), name=f"lane:{sid}")

    # -- SessionControl (used by commands) ----------------------------------------------------------

    def is_running(self, sid: str) -> bool:
        lane = self._lanes.get(sid)
        return bool(lane and lane.turn and not lane.turn.done() and not answer_final(lane))

    async def settled(self, sid: str, *, or_waiting_for_model: bool = False) -> None:
        """Returns once ``sid`` has nothing queued or running (its lane's worker has ended).

        With ``or_waiting_for_model`` also once all it holds waits for the model to come back, no try
        running or due: ``membot chat`` whose input ended leaves those messages pending for its next
        start, instead of waiting silently up to ``dispatcher.model_retry_max_age`` (an hour)."""
        lane = self._lanes.get(sid)
        while lane is not None and lane.worker is not None and not lane.worker.done():
            if or_waiting_for_model and self.model_wait(sid) is not None:
                assert lane.model_wait is not None  # (model_wait says so)
                if not lane.model_wait.woken:  # a woken wait tries at once: that try may answer
                    return
            await asyncio.wait([lane.worker], timeout=WAIT_LOOK if or_waiting_for_model else None)

    def answer_on_its_way(self, sid: str) -> bool:
        lane = self._lanes.get(sid)
        return bool(lane and lane.turn and not lane.turn.done() and answer_final(lane))

    def model_wait(self, sid: str) -> float | None:
        """Seconds until ``sid``'s waiting answers are tried again, ``None`` if it does not wait for the
        model, or a try runs now (a running one, see :meth:`is_running`, or one whose answer is final)."""
        lane = self._lanes.get(sid)
        if lane is None or lane.model_wait is None or (lane.turn is not None and not lane.turn.done()):
            return None
        return lane.model_wait.next_try_in()

    def queue_depth(self, sid: str) -> int:
        lane = self._lanes.get(sid)
        return queued_count(lane) if lane else 0

    def total_queued(self) -> int:
        return sum(queued_count(lane) for lane in self._lanes.values())

    def storage_wait(self, sid: str) -> str | None:
        """What of ``sid`` waits for storage to take it (its answer's save, say), or ``None``."""
        return self._delivery.storage_wait(sid)

    async def save_through(
        self, to: InboundMessage, what: str, write: Callable[[], Awaitable[object]], *, notice: str
    ) -> None:
        """See :class:`~bot.commands.SessionControl`. The chat is told only once the command is kept in
        the inbox (:meth:`Commands.keep`): the notice promises to finish it, and a slash command is not
        delivered again after a kill. Until the inbox takes it, each try of the write tries that too."""
        delivery, commands = self._delivery, self._commands
        told, tries = False, 0

        async def tell() -> None:
            nonlocal told
            if not told and await commands.keep():
                told = True
                await delivery.send(to, notice, error=True)

        async def attempt() -> object:
            nonlocal tries
            tries += 1
            if tries > 1:
                await tell()
            return await write()

        await delivery.persist(what, to.session_id, attempt, notice=tell)

    def storage_waits(self) -> dict[str, str]:
        """The writes holding up a chat until storage takes them (a full disk), each by what it is for
        and its chat (``"session_save (telegram:42)"``), with their errors."""
        return self._delivery.storage_waits()

    def running_turns(self) -> int:
        """Turns not finished yet, bookkeeping after the send included (the metrics gauge)."""
        return sum(1 for lane in self._lanes.values() if lane.turn is not None and not lane.turn.done())

    async def stop(self, sid: str) -> int | None:
        lane = self._lanes.get(sid)
        if lane is None or lane.stopping is not None:
            return None
        turn = lane.turn
        if turn is None or turn.done():
            return await self._turns.stop_waiting(sid, lane) if lane.model_wait is not None else None
        if answer_final(lane):
            # Saved and sent, through an outage maybe: it is no reply to stop any more, as /status says
            # (stopped, it was dropped, while the history and memory kept it).
            return None
        kept, later = take_messages(lane)
        request = lane.stopping = Stop(list(lane.batch), kept)
        turn.cancel()
        await request.done  # the worker did the bookkeeping (see Stop)
        return len(kept) + later

    def exclusive(self, sid: str) -> AbstractAsyncContextManager[None]:
        """See :class:`~bot.commands.SessionControl` and :meth:`Commands.exclusive`."""
        return self._commands.exclusive(sid)

    # -- shutdown ---------------------------------------------------------------------------------

    async def close(self, grace: float) -> None:
        """Stop taking messages, let running turns finish for ``grace`` seconds, then cancel the rest.

        Messages that arrive meanwhile are kept in the inbox but not queued; they, the queued ones that
        never ran, the turns cut short and the commands still waiting for their chat's turn stay pending
        and are finished after the next start. Last, the sessions are saved that changed since their
        last save, their note of the commands run included; one that storage refuses (a full disk) is
        logged and the others are still saved: its messages are pending in the inbox, and the next start
        answers them (raised, it failed the whole shutdown, and left the other sessions unsaved).
        """
        self._arrivals.accepting = False
        self._delivery.begin_shutdown()
        workers = [lane.worker for lane in self._lanes.values() if lane.worker and not lane.worker.done()]
        workers += self._commands.tasks
        for lane in self._lanes.values():
            # The queue stays pending in the inbox, finished on the next start in its order. Only the
            # commands right behind the running turn (a /new sent during it) still run once it ended;
            # one behind a queued message stops waiting: run now, it would come before that message.
            ahead = list(itertools.takewhile(lambda item: isinstance(item, Command), lane.queue))
            for item in itertools.islice(lane.queue, len(ahead), None):
                if isinstance(item, Command):
                    item.task.cancel()
            lane.queue = deque(ahead)
            if lane.model_wait is not None:
                lane.model_wait.wake()  # nothing left to try: its worker ends now
        if workers:
            _, pending = await asyncio.wait(workers, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
        for session in self._sessions.cached_sessions():
            if session.unsaved:  # (a command's note may be all that changed: see Session.unsaved)
                try:
                    await self._sessions.save(session)
                except StorageError as exc:
                    log.error(
                        "session_not_saved_at_stop",
                        session_id=session.id,
                        error=str(exc),
                        kept="its unanswered messages stay pending in the inbox: the next start answers them",
                    )
