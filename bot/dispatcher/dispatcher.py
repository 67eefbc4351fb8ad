"""The dispatcher: the hand-off point between channels and the pipeline, and what commands may do.

It takes each inbound message in (dedup, the inbox, the chat's lane), answers commands at once beside
the chat's turn, replays at start what a previous run accepted, and drains the lanes at shutdown. The
lanes' work runs in bot/dispatcher/turns.py, and answers go out through bot/dispatcher/delivery.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator, Awaitable

import structlog

from bot import intake, recovery
from bot.commands import CommandCall, CommandRouter
from bot.config import DispatcherSettings
from bot.dispatcher.delivery import RETRY, SEND_PATIENCE, Delivery
from bot.dispatcher.lanes import (
    Command,
    KeptCommand,
    Lane,
    Queued,
    Stop,
    messages_ahead,
    queued_count,
    take_messages,
)
from bot.dispatcher.turns import TurnObserver, Turns
from bot.domain import InboundMessage, Session
from bot.errors import StorageError
from bot.inbox import Inbox
from bot.model_wait import WaitRecords
from bot.ports import ChannelPort
from bot.retry import Backoff
from bot.sessions import SessionService
from pipeline import Pipeline

log = structlog.get_logger(__name__)


class Dispatcher:
    """The hand-off point between channels and the pipeline (see the package doc, bot/dispatcher/__init__.py).

    ``submit`` returns once the message is durably queued, which is when a channel may acknowledge it.
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
    ) -> None:
        self._pipeline = pipeline
        self._sessions = sessions
        self._commands = commands
        self._settings = settings
        self._inbox = inbox
        self._waits = waits  # the chats waiting for the model, as a restart finds them
        self._max_chars = max_inbound_chars
        self._channels: dict[str, ChannelPort] = {}
        self._ready: set[str] = set()
        self._lanes: dict[str, Lane] = {}
        self._accepting = True
        # Commands being answered; one that waits for its chat's running turn (/new, /compact) sets its
        # ``placed`` once it holds its place in the lane: from then on ``submit`` need not wait for it.
        self._commands_running: dict[asyncio.Task[None], Command] = {}
        self._delivery = Delivery(self._channels, inbox, settings, retry=retry, send_patience=send_patience)
        self._turns = Turns(
            pipeline,
            sessions,
            settings,
            self._channels,
            self._delivery,
            self._run_kept,
            inbox=inbox,
            waits=waits,
            observer=observer,
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
        platform. A platform message already accepted (a redelivery after a crash) is ignored.
        """
        message = intake.bounded(message, self._max_chars)
        call = self._commands.parse(message)
        if call is not None:
            if not self._accepting:
                await self._delivery.send(
                    message, "I'm restarting — please send that command again in a minute."
                )
                return
            taken, noted = await self._take_command(call)
            if not taken:
                log.info(
                    "duplicate_command_ignored", session_id=call.session_id, message_id=message.message_id
                )
                return
            await self._command(call, noted)
            return
        lane = self._lane(message.session_id, message.channel, message.chat_id)
        async with lane.intake:  # one at a time per session, so the order of arrival is kept
            if await self._seen(message):
                log.info(
                    "duplicate_message_ignored", session_id=message.session_id, message_id=message.message_id
                )
                return
            entry_id, durable = self._inbox.add(message) if self._inbox else (None, None)
            if durable is not None:
                # On disk before it is queued: a message that could not be stored is never answered
                # (the channel does not confirm it, and the platform's redelivery is taken as new).
                # Only this session's later messages wait here, and they would wait for its inbox file.
                await durable
            if self._accepting and not lane.queue and (lane.turn is None or self._settings.mode != "collect"):
                # It will be a turn of its own: its systems may start on it while the turn is set up. (In
                # collect mode, one that arrives during a turn may be answered together with the next.)
                self._pipeline.anticipate(message)
            queued = Queued(message, [entry_id] if entry_id else [])
            notice = self._enqueue(message.session_id, lane, queued) if self._accepting else None
        if not self._accepting:
            # Shutting down: the inbox keeps it and the next start answers it.
            await self._delivery.send(message, "I'm restarting — I'll answer this as soon as I'm back.")
        elif notice is not None:
            await notice

    async def _take_command(self, call: CommandCall) -> tuple[bool, Session | None]:
        """Whether ``call`` is taken (``False``: a redelivery of a command taken before, kept in the
        inbox while it waits for its turn or noted in its session as run), and the session that is to
        note it as run (:meth:`_answer`; see :func:`bot.intake.note_command`)."""
        sid, message_id = call.session_id, call.message.message_id
        if message_id is None:
            return True, None
        if self._inbox is not None and self._inbox.holds(sid, message_id):
            return False, None
        try:
            session = await self._sessions.get(sid)
        except StorageError:
            return True, None
        if session is None:  # no conversation yet: nothing a second run could undo
            return True, None
        if intake.command_run(session, message_id):
            return False, None
        return True, session

    async def _command(self, call: CommandCall, noted: Session | None = None) -> None:
        """Answer a command. Returns once it is answered, or once it waits for its chat's lane
        (:meth:`exclusive`): it then holds its place in the lane and answers when it is done. A channel
        hands a chat's messages over one at a time, so a /new that kept ``submit`` waiting for a long
        turn would keep the /stop, /status or message sent after it from reaching us until then."""
        task, command = self._start_command(call, noted=noted)
        waiting = asyncio.ensure_future(command.placed.wait())
        try:
            await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if command.durable is not None:
            try:  # kept in the inbox before the channel confirms it, as a message is
                await command.durable
            except BaseException:
                # Not kept: it does not run, and the platform's redelivery is taken as new (its place
                # in the queue goes too, or the worker would note it as run when it came).
                lane = self._lanes.get(call.session_id)
                if lane is not None and command in lane.queue:
                    lane.queue.remove(command)
                task.cancel()
                raise
        if not task.done() and self.is_running(call.session_id):  # (not for a sent reply's bookkeeping)
            await self._delivery.send(call.message, self._wait_notice(command))

    def _wait_notice(self, command: Command) -> str:
        """What a command waiting for the running turn tells the chat: when it runs, and how sooner."""
        name, lane = command.call.name, self._lanes.get(command.call.session_id)
        ahead = messages_ahead(lane, command) if lane else 0
        if not ahead:
            return (
                f"⏳ /{name} runs as soon as the current reply is done. "
                f"Send /stop to end that reply now; /{name} then runs at once."
            )
        plural = "message" if ahead == 1 else "messages"
        return (
            f"⏳ /{name} runs once the current reply and the {ahead} {plural} sent before it are answered. "
            f"Send /stop to end that reply now (they are kept in the history); /{name} then runs at once."
        )

    def _start_command(
        self, call: CommandCall, *, entry: str | None = None, noted: Session | None = None
    ) -> tuple[asyncio.Task[None], Command]:
        task = asyncio.create_task(self._answer(call), name=f"command:{call.name}:{call.session_id}")
        command = self._commands_running[task] = Command(call, task, entry=entry, noted=noted)
        task.add_done_callback(lambda t: self._commands_running.pop(t, None))
        return task, command

    async def _run_kept(self, waiting: KeptCommand | Command) -> None:
        """Run a command that waits for its chat's turn (the lane's worker calls it in the command's
        place in the queue): one queued now goes on, one kept when the last run ended starts; returns
        once it ran. It is noted as run now, before it acts (see :func:`bot.intake.note_command`)."""
        call, message_id = waiting.call, waiting.call.message.message_id
        if isinstance(waiting, Command) and waiting.task.done():
            return  # it was not kept after all (see _command): its redelivery is a new command
        try:
            session = await self._sessions.get(call.session_id)
        except StorageError:
            session = None
        if isinstance(waiting, KeptCommand):
            if session is not None and message_id is not None and intake.command_run(session, message_id):
                # It ran and its session was saved, but a kill came before its inbox entry was done.
                log.info("duplicate_command_ignored", session_id=call.session_id, message_id=message_id)
                await self._entry_done(call.session_id, waiting.entry)
                return
            task, _ = self._start_command(call, entry=waiting.entry, noted=session)
        else:
            if session is not None and call.message.message_id is not None:
                intake.note_command(session, call.message.message_id)
            task = waiting.task
            waiting.reached.set()
        await asyncio.wait([task])

    async def _answer(self, call: CommandCall) -> None:
        current = asyncio.current_task()
        command = self._commands_running.get(current) if current else None
        if command is not None and command.noted is not None and call.message.message_id is not None:
            # Noted before it acts, with no wait until it either acts or, if it has to wait for its
            # turn, takes the note back (exclusive): a save meanwhile must not note a command that
            # is not kept in the inbox yet.
            intake.note_command(command.noted, call.message.message_id)
        try:
            reply = await self._commands.handle(call, self)
        except Exception:
            log.exception("command_failed", command=call.name, session_id=call.session_id)
            reply = f"/{call.name} failed; the details are in the log."
        await self._command_done(command)  # (done already if it waited for the lane: see exclusive)
        await self._delivery.send(call.message, reply)

    async def _command_done(self, command: Command | None) -> None:
        """A kept command ran (or failed for good): the next start must not run it again."""
        if command is None or command.entry is None or self._inbox is None:
            return
        entry, command.entry = command.entry, None
        await self._entry_done(command.call.session_id, entry)

    async def _entry_done(self, sid: str, entry: str) -> None:
        if self._inbox is not None:
            inbox = self._inbox
            await self._delivery.persist("inbox_done_mark", lambda: inbox.finish(sid, {entry}))

    async def _seen(self, message: InboundMessage) -> bool:
        """Whether this platform message was accepted before (still pending, or already answered)."""
        if message.message_id is None:
            return False
        if self._inbox is not None and self._inbox.holds(message.session_id, message.message_id):
            return True
        try:
            session = await self._sessions.get(message.session_id)
        except StorageError:
            return False
        return session is not None and intake.already_taken(session.messages, message.message_id)

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
                if not isinstance(item, recovery.Answer):
                    lane.queue.append(item)
                elif (call := self._commands.parse(item.message)) is not None:
                    lane.queue.append(KeptCommand(call, item.entry_id))  # it waited for a turn
                else:
                    lane.queue.append(Queued(item.message, [item.entry_id], in_session=item.in_session))
                    answered.add(item.entry_id)
            record = records.pop(sid, None)
            if record is not None and answered & record.entries:
                lane.model_wait = record.resumed()  # the same wait goes on: the chat was told already
            elif record is not None:
                records[sid] = record
            if lane.channel in self._ready:
                self._start_worker(sid, lane)
        for sid in records:  # waits whose messages were answered (or are not to be) before the last stop
            assert self._waits is not None
            await self._waits.end(sid)
        return sum(len(w) for w in planned.values())

    def _lane(self, sid: str, channel: str, chat_id: str) -> Lane:
        lane = self._lanes.get(sid)
        if lane is None:
            lane = self._lanes[sid] = Lane(channel, chat_id)
        return lane

    def _enqueue(self, sid: str, lane: Lane, queued: Queued) -> Awaitable[None] | None:
        """Queue without awaiting (so arrival order is kept); returns the overflow notice to await."""
        notice: Awaitable[None] | None = None
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
        if lane.channel in self._ready:
            self._start_worker(sid, lane)
        return notice

    def _start_worker(self, sid: str, lane: Lane) -> None:
        if lane.worker is None or lane.worker.done():
            lane.worker = asyncio.create_task(self._turns.work(sid, lane), name=f"lane:{sid}")

    # -- SessionControl (used by commands) ----------------------------------------------------------

    def is_running(self, sid: str) -> bool:
        lane = self._lanes.get(sid)
        return bool(lane and lane.turn and not lane.turn.done() and not lane.sent)

    async def settled(self, sid: str) -> None:
        """Returns once ``sid`` has nothing queued or running (its lane's worker has ended)."""
        lane = self._lanes.get(sid)
        while lane is not None and lane.worker is not None and not lane.worker.done():
            await asyncio.wait([lane.worker])

    def model_wait(self, sid: str) -> float | None:
        """Seconds until ``sid``'s waiting answers are tried again, ``None`` if it does not wait for the
        model (a try running now counts as running, see :meth:`is_running`)."""
        lane = self._lanes.get(sid)
        if lane is None or lane.model_wait is None or self.is_running(sid):
            return None
        return lane.model_wait.next_try_in()

    def queue_depth(self, sid: str) -> int:
        lane = self._lanes.get(sid)
        return queued_count(lane) if lane else 0

    def total_queued(self) -> int:
        return sum(queued_count(lane) for lane in self._lanes.values())

    def running_turns(self) -> int:
        """Turns not finished yet, bookkeeping after the send included (the metrics gauge)."""
        return sum(1 for lane in self._lanes.values() if lane.turn is not None and not lane.turn.done())

    async def stop(self, sid: str) -> int | None:
        lane = self._lanes.get(sid)
        if lane is None or lane.stopping is not None:
            return None
        if lane.turn is None or lane.turn.done() or lane.sent:
            # (``sent``: the answer is saved and on its way, through an outage maybe: it is no reply to
            # stop any more, as /status says, and stopping its delivery dropped it)
            return await self._turns.stop_waiting(sid, lane) if lane.model_wait is not None else None
        kept, later = take_messages(lane)
        request = lane.stopping = Stop(list(lane.batch), kept)
        lane.turn.cancel()
        await request.done  # the worker did the bookkeeping (see Stop)
        return len(kept) + later

    @contextlib.asynccontextmanager
    async def exclusive(self, sid: str) -> AsyncIterator[None]:
        """See :class:`~bot.commands.SessionControl`. A command that has to wait (a turn runs, or the chat
        has messages queued) takes its place in the lane's queue, behind what the chat sent before it,
        as the next start would queue it: the lane's worker runs it there. Meanwhile it is kept in the
        inbox (its line queued now, before anything the chat sends after it) and marked done once it
        ran, before the lane goes on: a restart never runs it again after what came next. While the chat
        waits for the model between tries, a command runs at once (the waiting messages stay queued)."""
        channel, _, chat = sid.partition(":")
        lane = self._lane(sid, channel, chat)
        command = self._commands_running.get(asyncio.current_task())  # type: ignore[arg-type]
        busy = lane.lock.locked() or (bool(lane.queue) and lane.model_wait is None)
        if command is not None and command.entry is None and busy:
            message_id = command.call.message.message_id
            if command.noted is not None and message_id is not None:
                intake.forget_command(command.noted, message_id)  # noted again when its place comes
            if self._inbox is not None:
                command.entry, command.durable = self._inbox.add(command.call.message)
            lane.queue.append(command)
            command.placed.set()  # it waits: ``submit`` returns
            if lane.channel in self._ready:
                self._start_worker(sid, lane)
            await command.reached.wait()
        async with lane.lock:
            try:
                yield
            except Exception:
                await self._command_done(command)  # it failed: a restart would not do better
                raise
            await self._command_done(command)

    # -- shutdown ---------------------------------------------------------------------------------

    async def close(self, grace: float) -> None:
        """Stop taking messages, let running turns finish for ``grace`` seconds, then cancel the rest.

        Messages that arrive meanwhile are kept in the inbox but not queued; they, the queued ones that
        never ran, the turns cut short and the commands still waiting for their chat's turn stay pending
        and are finished after the next start.
        """
        self._accepting = False
        self._delivery.begin_shutdown()
        workers = [lane.worker for lane in self._lanes.values() if lane.worker and not lane.worker.done()]
        workers += self._commands_running
        for lane in self._lanes.values():
            # The queue stays pending in the inbox, finished on the next start in its order. Only the
            # commands right behind the running turn (a /new sent during it) still run once it ended;
            # one behind a queued message stops waiting: run now, it would come before that message.
            ahead = list(itertools.takewhile(lambda item: isinstance(item, Command), lane.queue))
            for item in lane.queue:
                if isinstance(item, Command) and item not in ahead:
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
            if session.rewrite_needed or session.persisted_count != len(session.messages):
                await self._sessions.save(session)
