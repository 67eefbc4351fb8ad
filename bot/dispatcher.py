"""Routes inbound messages to sessions: one turn at a time per session, nothing dropped, nothing twice.

For every session (``<channel>:<chat>``) there is a lane: a queue and at most one running turn.
Messages that arrive during a turn wait in order; when the turn ends, the queued messages are taken
together as the next turn's input (``collect`` mode) or one by one (``per_message``). Commands skip the
queue and are answered at once, even while a slow turn runs; one that must wait for the turn (/new,
/compact) takes its place in the lane and answers later, so it never holds up what the chat sends next
(a /stop). Such a waiting command is kept in the inbox like a message (the chat was told it will run):
after a kill the next start runs it once, in the order it was sent. Different sessions run concurrently.

The durable path of a message (three fsyncs when it is answered):

1. ``submit`` appends it to the inbox and returns; only then may the channel confirm it to the platform;
2. the turn's messages and its answer are saved in one append of the session log (bot/outbox.py);
3. once the channel confirmed the send, the inbox marks the message done.

A kill at any point leaves the message pending in the inbox, and :meth:`Dispatcher.recover` finishes
it on the next start (bot/recovery.py). A turn the model could not answer for now (down, rate limited,
too slow) is not answered: its messages stay pending and the lane tries it again later, by itself
(bot/model_wait.py). ``recover`` runs before any channel starts; a chat's turns run
once its channel is :meth:`~Dispatcher.ready`, so answers never go to a channel that cannot send yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import structlog

from bot import intake, recovery
from bot.commands import CommandCall, CommandRouter
from bot.config import DispatcherSettings
from bot.domain import InboundMessage, OutboundMessage, Session, utcnow
from bot.errors import ChannelRefused, StorageError, plain_reason
from bot.inbox import Inbox
from bot.model_wait import NOTICE as MODEL_NOTICE
from bot.model_wait import ModelWait, WaitRecords, model_failure, waits_for_model
from bot.outbox import PendingReply
from bot.ports import ChannelPort
from bot.retry import Backoff, retry
from bot.sessions import SessionService
from pipeline import Pipeline, Turn

log = structlog.get_logger(__name__)

RETRY = Backoff(2.0, 60.0)  # pauses before sending or writing again after a failure
SEND_PATIENCE = 3600.0  # seconds an unsent answer holds its chat before it waits for the next start
_Delivery = Literal["sent", "failed", "refused"]  # went out; may go out later; never will as it is
STORAGE_NOTICE = (
    "⚠️ I have an answer but cannot save our conversation right now (a problem on the server). "
    "I'll send it as soon as I can — nothing is lost."
)


class TurnObserver(Protocol):
    """Told about every finished turn (metrics)."""

    def turn_finished(self, channel: str, outcome: str, seconds: float) -> None: ...


@dataclass(slots=True)
class _Queued:
    message: InboundMessage
    entries: list[str] = field(default_factory=list)  # inbox entry ids folded into this message
    in_session: bool = False  # recovered after a turn that saved it: the session holds it already


@dataclass(slots=True)
class _Command:
    """A command being answered. One that waits for its chat's lane (:meth:`Dispatcher.exclusive`) sets
    ``placed`` once it holds its place there, and is kept in the inbox from then on (``entry``, durable
    once ``durable`` is done) until it ran, so the next start runs it should this run end first."""

    call: CommandCall
    placed: asyncio.Event = field(default_factory=asyncio.Event)
    entry: str | None = None
    durable: asyncio.Task[None] | None = None


@dataclass(frozen=True, slots=True)
class _KeptCommand:
    """A command that waited for its chat's lane when the last run ended (see :class:`_Command`): the
    lane's worker runs it in its place, after what was sent before it."""

    call: CommandCall
    entry: str


@dataclass(slots=True)
class _Stop:
    """A /stop of the running turn: its batch and the queued messages it keeps in the history. The lane's
    worker does that bookkeeping as soon as the turn ended, before anything else takes the lane (a
    command waiting for the turn, or a message that arrived meanwhile), so the kept messages are in
    the history before them; ``done`` tells /stop it was done."""

    stopped: list[_Queued]
    kept: list[_Queued]
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass(slots=True)
class _Lane:
    channel: str
    chat_id: str
    queue: deque[_Queued | PendingReply | _KeptCommand] = field(default_factory=deque)  # replies: to resend
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    intake: asyncio.Lock = field(default_factory=asyncio.Lock)  # keeps arrival order through dedup
    worker: asyncio.Task[None] | None = None
    turn: asyncio.Task[None] | None = None
    batch: list[_Queued] = field(default_factory=list)  # what the running turn answers
    sent: bool = False  # the running turn's answer went out; only its bookkeeping is left
    overflow_noticed: bool = False
    stopping: _Stop | None = None  # what /stop asked of the running turn; the worker does it
    # Answers not delivered (refused for good, or past the patience), kept in the inbox: each is tried
    # once more before the chat's next answer, so an unblocked chat gets them in order.
    set_aside: list[PendingReply] = field(default_factory=list)
    # The model was out of reach: the failed turn's messages are back at the head of the queue, and the
    # worker waits for the next try (bot/model_wait.py).
    model_wait: ModelWait | None = None


class Dispatcher:
    """The hand-off point between channels and the pipeline (see the module doc).

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
        self._retry = retry
        self._send_patience = send_patience
        self._pipeline = pipeline
        self._sessions = sessions
        self._commands = commands
        self._settings = settings
        self._inbox = inbox
        self._waits = waits  # the chats waiting for the model, as a restart finds them
        self._max_chars = max_inbound_chars
        self._observer = observer
        self._channels: dict[str, ChannelPort] = {}
        self._ready: set[str] = set()
        self._lanes: dict[str, _Lane] = {}
        self._accepting = True
        # Commands being answered; one that waits for its chat's running turn (/new, /compact) sets its
        # ``placed`` once it holds its place in the lane: from then on ``submit`` need not wait for it.
        self._commands_running: dict[asyncio.Task[None], _Command] = {}
        self._closing = asyncio.Event()  # set by close(): resends stop waiting (the inbox keeps them)
        self.turns_completed = 0  # finished turns since start (tests and operators wait on it)

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
                await self._send(message, "I'm restarting — please send that command again in a minute.")
                return
            if (
                message.message_id is not None
                and self._inbox is not None
                and self._inbox.holds(call.session_id, message.message_id)
            ):
                log.info(
                    "duplicate_command_ignored", session_id=call.session_id, message_id=message.message_id
                )
                return  # kept while it waits for its turn (a redelivery after a crash): it runs once
            await self._command(call)
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
            queued = _Queued(message, [entry_id] if entry_id else [])
            notice = self._enqueue(message.session_id, lane, queued) if self._accepting else None
        if not self._accepting:
            # Shutting down: the inbox keeps it and the next start answers it.
            await self._send(message, "I'm restarting — I'll answer this as soon as I'm back.")
        elif notice is not None:
            await notice

    async def _command(self, call: CommandCall) -> None:
        """Answer a command. Returns once it is answered, or once it waits for the chat's running turn
        (:meth:`exclusive`): it then holds its place in the lane and answers when it is done. A channel
        hands a chat's messages over one at a time, so a /new that kept ``submit`` waiting for a long
        turn would keep the /stop, /status or message sent after it from reaching us until then."""
        task, command = self._start_command(call)
        waiting = asyncio.ensure_future(command.placed.wait())
        try:
            await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if command.durable is not None:
            try:  # kept in the inbox before the channel confirms it, as a message is
                await command.durable
            except BaseException:
                task.cancel()  # not kept: it does not run, and the platform's redelivery is taken as new
                raise
        if not task.done() and self.is_running(call.session_id):  # (not for a sent reply's bookkeeping)
            wait = (
                f"⏳ /{call.name} runs as soon as the current reply is done. "
                f"Send /stop to end that reply now; /{call.name} then runs at once."
            )
            await self._send(call.message, wait)

    def _start_command(
        self, call: CommandCall, *, entry: str | None = None
    ) -> tuple[asyncio.Task[None], _Command]:
        task = asyncio.create_task(self._answer(call), name=f"command:{call.name}:{call.session_id}")
        command = self._commands_running[task] = _Command(call, entry=entry)
        task.add_done_callback(lambda t: self._commands_running.pop(t, None))
        return task, command

    async def _answer(self, call: CommandCall) -> None:
        try:
            reply = await self._commands.handle(call, self)
        except Exception:
            log.exception("command_failed", command=call.name, session_id=call.session_id)
            reply = f"/{call.name} failed; the details are in the log."
        current = asyncio.current_task()
        command = self._commands_running.get(current) if current else None
        await self._command_done(command)  # (done already if it waited for the lane: see exclusive)
        await self._send(call.message, reply)

    async def _command_done(self, command: _Command | None) -> None:
        """A kept command ran (or failed for good): the next start must not run it again."""
        if command is None or command.entry is None or self._inbox is None:
            return
        inbox, sid, entry = self._inbox, command.call.session_id, command.entry
        command.entry = None
        await self._persist("inbox_done_mark", lambda: inbox.finish(sid, {entry}))

    async def _save(self, session: Session, turn: Turn, *, replies: list[PendingReply]) -> None:
        """Save the session with ``replies``, and wait for the turn's own writes (``turn.writes``) in the
        meantime: both are on disk before the reply goes out. A failed write of the turn's is logged like
        a failed system (the answer still goes out: its messages are in the session, saved)."""
        writes = asyncio.gather(*turn.writes, return_exceptions=True)
        try:
            await self._sessions.save(session, replies=replies)
        finally:
            for result in await asyncio.shield(writes):
                if isinstance(result, Exception):
                    error = f"{type(result).__name__}: {result}"
                    log.error("turn_write_failed", error=error, exc_info=result)

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
                    lane.queue.append(_KeptCommand(call, item.entry_id))  # it waited for a turn
                else:
                    lane.queue.append(_Queued(item.message, [item.entry_id], in_session=item.in_session))
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

    def _lane(self, sid: str, channel: str, chat_id: str) -> _Lane:
        lane = self._lanes.get(sid)
        if lane is None:
            lane = self._lanes[sid] = _Lane(channel, chat_id)
        return lane

    def _enqueue(self, sid: str, lane: _Lane, queued: _Queued) -> Awaitable[None] | None:
        """Queue without awaiting (so arrival order is kept); returns the overflow notice to await."""
        notice: Awaitable[None] | None = None
        last = lane.queue[-1] if lane.queue else None
        if (
            len(lane.queue) >= self._settings.queue_limit
            and isinstance(last, _Queued)
            and not last.in_session
        ):
            # Never drop: fold the overflow into the newest queued message and tell the user once.
            merged = dataclasses.replace(
                last.message,
                text=f"{last.message.text}\n\n{queued.message.text}",
                attachments=last.message.attachments + queued.message.attachments,
            )
            lane.queue[-1] = _Queued(merged, last.entries + queued.entries)
            if not lane.overflow_noticed:
                lane.overflow_noticed = True
                notice = self._send(
                    queued.message,
                    f"I'm still on your earlier messages ({len(lane.queue)} waiting). "
                    "I'll read everything you send together when I'm done — nothing is lost.",
                )
        else:
            lane.queue.append(queued)
        if lane.model_wait is not None:  # it joins the waiting messages, and they are tried now
            lane.model_wait.wake()
        if lane.channel in self._ready:
            self._start_worker(sid, lane)
        return notice

    def _start_worker(self, sid: str, lane: _Lane) -> None:
        if lane.worker is None or lane.worker.done():
            lane.worker = asyncio.create_task(self._work(sid, lane), name=f"lane:{sid}")

    # -- turns ------------------------------------------------------------------------------------

    async def _work(self, sid: str, lane: _Lane) -> None:
        while lane.queue:
            if (kept := _next_command(lane)) is not None:  # it takes the lane itself (exclusive)
                task, _ = self._start_command(kept.call, entry=kept.entry)
                await asyncio.wait([task])
                continue
            if lane.model_wait is not None:  # outside the lock: commands (/new, /compact) run meanwhile
                await lane.model_wait.until_next_try()
            async with lane.lock:
                if not lane.queue:
                    break
                head = lane.queue[0]
                if isinstance(head, _KeptCommand):  # (left at the head by a /stop of the wait)
                    continue
                if isinstance(head, PendingReply):  # a saved answer from before a restart
                    lane.queue.popleft()
                    await self._deliver(head, lane)
                    continue
                batch: list[_Queued] = []
                while lane.queue and isinstance(queued := lane.queue[0], _Queued):
                    lane.queue.popleft()
                    batch.append(queued)
                    if self._settings.mode != "collect":
                        break
                lane.overflow_noticed = False
                lane.batch, lane.sent = batch, False
                lane.turn = asyncio.create_task(self._run_turn(lane, batch), name=f"turn:{sid}")
                try:
                    await lane.turn
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise  # the worker itself is being cancelled (shutdown)
                    # else: the turn was stopped by /stop, whose bookkeeping follows below
                except Exception:
                    log.exception("turn_crashed", session_id=sid)
                finally:
                    lane.turn = None
                    request, lane.stopping = lane.stopping, None
                    if request is not None:
                        await self._wait_over(sid, lane)  # /stop of a try: no more tries
                        await self._stopped(sid, lane, request)

    async def _run_turn(self, lane: _Lane, batch: list[_Queued]) -> None:
        started = time.perf_counter()
        outcome = "ok"
        first = batch[0].message
        channel = self._channels.get(lane.channel)
        entries = tuple(e for q in batch for e in q.entries)
        async with self._sessions.lease(lane.channel, lane.chat_id) as session:
            structlog.contextvars.bind_contextvars(session_id=session.id, channel=lane.channel)
            try:
                # A message the session held when it was queued may be gone since (a /new while the lane
                # waited for the model): it is added again, or the answer would not know the question.
                held = intake.entries_in(session.messages) if any(q.in_session for q in batch) else set()
                for queued in batch:
                    if not (queued.in_session and held.issuperset(queued.entries)):
                        session.append(intake.user_message(queued.message, queued.entries))
                turn = Turn(
                    session=session,
                    inbound=tuple(q.message for q in batch),
                    on_partial=channel.partial_sink(lane.chat_id, first.message_id) if channel else None,
                    now=intake.turn_time(q.message for q in batch),
                )
                structlog.contextvars.bind_contextvars(turn_id=turn.id)
                log.info("turn_started", messages=len(batch))
                try:
                    activity = channel.activity(lane.chat_id) if channel else contextlib.nullcontext()
                    async with activity, asyncio.timeout(self._settings.turn_timeout):
                        await self._pipeline.run(turn)
                except TimeoutError:
                    outcome = "timeout"
                    limit = f"{self._settings.turn_timeout:g}"
                    turn.notes.append(f"Stopped: this answer took longer than {limit} s.")
                    log.warning("turn_timed_out", seconds=self._settings.turn_timeout)
                except asyncio.CancelledError:
                    outcome = "stopped"
                    # The question (and what the turn did) is kept; unless /stop asked for it, the
                    # inbox entries stay pending and the next start answers them.
                    await asyncio.shield(self._save(session, turn, replies=[]))
                    raise
                if (
                    outcome == "ok"
                    and waits_for_model(turn)
                    and await self._wait_for_model(lane, batch, session, turn)
                ):
                    outcome = "waiting"
                    return
                if lane.model_wait is not None:
                    waited = time.monotonic() - lane.model_wait.since
                    log.info(
                        "turn_retried",
                        chat_id=lane.chat_id,
                        attempts=lane.model_wait.attempts + 1,
                        waited_seconds=round(waited, 1),
                        answered=bool(turn.reply and turn.reply.strip()),
                    )
                    await self._wait_over(session.id, lane)
                text, is_error = _reply_text(turn)
                if is_error and outcome == "ok":
                    outcome = "error"
                reply = PendingReply(
                    lane.channel, lane.chat_id, text, entries, reply_to=first.message_id, is_error=is_error
                )
                # The answer is on disk before it is sent: a crash from here on resends, never re-asks.
                # A full disk holds the chat here until the save goes through (nothing else is lost).
                await self._persist(
                    "session_save",
                    lambda: self._save(session, turn, replies=[reply] if entries else []),
                    notice=lambda: self._send(first, STORAGE_NOTICE, error=True),
                )
                self.turns_completed += 1
                log.info("turn_finished", outcome=outcome, failures=len(turn.failures))
                await self._deliver(reply, lane, answers_turn=True)
            finally:
                if self._observer is not None:
                    self._observer.turn_finished(lane.channel, outcome, time.perf_counter() - started)
                structlog.contextvars.unbind_contextvars("session_id", "channel", "turn_id")

    async def _wait_for_model(self, lane: _Lane, batch: list[_Queued], session: Session, turn: Turn) -> bool:
        """Keep a turn the model could not answer for now, to try it again later (bot/model_wait.py);
        ``False`` once the chat has waited ``model_retry_max_age``: the turn then fails as any other.

        The turn's messages (and what it did) are saved in the session, unanswered, and go back to the
        head of the queue; their inbox entries stay pending, so a restart meanwhile answers them once.
        The chat is told once, at the first failure; the notice is an aside, never the answer. The wait
        is recorded before the notice goes out, so a restart goes on with it without telling again."""
        settings = self._settings
        wait = lane.model_wait or ModelWait()
        backoff = Backoff(settings.model_retry_first, settings.model_retry_max)
        failure = model_failure(turn)
        pause = wait.schedule(
            backoff, settings.model_retry_max_age, hint=failure.retry_after if failure else None
        )
        if pause is None:
            if lane.model_wait is not None:  # (with model_retry_max_age = 0 nothing waited)
                log.warning("model_wait_gave_up", chat_id=lane.chat_id, attempts=wait.attempts + 1)
            return False
        await self._persist("session_save", lambda: self._save(session, turn, replies=[]))
        for queued in batch:
            queued.in_session = True
        lane.queue.extendleft(reversed(batch))  # before what arrived meanwhile: the order holds
        first_failure, lane.model_wait = lane.model_wait is None, wait
        log.warning(
            "turn_waiting_for_model", chat_id=lane.chat_id, attempt=wait.attempts, next_try_in=round(pause, 1)
        )
        if first_failure:
            if self._waits is not None:
                await self._waits.begin(batch[0].message.session_id, [e for q in batch for e in q.entries])
            await self._send(batch[0].message, MODEL_NOTICE)
        return True

    async def _wait_over(self, sid: str, lane: _Lane) -> None:
        """The chat waits for the model no more (answered, given up, or /stop): a restart starts afresh."""
        lane.model_wait = None
        if self._waits is not None:
            await self._waits.end(sid)

    async def _deliver(self, reply: PendingReply, lane: _Lane, *, answers_turn: bool = False) -> None:
        """Send a saved answer; once it went out, its inbox entries are done.

        Answers of the chat set aside earlier go first, once each. A platform that refuses the answer
        past the channel's own retries (an outage): it is kept in the inbox, so a restart sends it, and
        sent again here with growing pauses for up to ``send_patience`` while the chat waits, so answers
        keep their order. A platform that refuses it for good (:class:`~bot.errors.ChannelRefused`:
        the user blocked the bot, the chat is gone) would refuse every try: it is kept and set aside at
        once, and the chat's later answers are each tried once, as this one was. A done mark the disk
        refuses is written again until it goes through: left out, the next start would answer twice."""
        inbox = self._inbox
        await self._send_set_aside(lane)
        outcome = await self._send_out(reply.outbound())
        if answers_turn:
            lane.sent = True  # for /status and /stop the turn is over; the done mark is bookkeeping
        if inbox is None or not reply.entries:
            return
        if outcome != "sent":
            await self._persist("reply_keep", lambda: inbox.keep(reply))
            if outcome == "failed":
                outcome = await self._resend(reply)
            if outcome != "sent":
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

    async def _send_set_aside(self, lane: _Lane) -> None:
        """Try the chat's set-aside answers once each, oldest first, until one does not go out. One kept
        past ``kept_reply_max_age`` is not tried any more: the inbox moves it to its expired folder."""
        while lane.set_aside:
            reply = lane.set_aside[0]
            if self._inbox is not None and reply.expired(self._settings.kept_reply_max_age, utcnow()):
                await self._persist("reply_expire", functools.partial(self._inbox.expire, reply))
                lane.set_aside.pop(0)
                continue
            if await self._send_out(reply.outbound()) != "sent":
                return
            lane.set_aside.pop(0)
            log.info("reply_sent_late", channel=reply.channel, chat_id=reply.chat_id, reply_id=reply.id)
            await self._finish(reply)

    async def _finish(self, reply: PendingReply) -> None:
        if self._inbox is None or not reply.entries:
            return
        inbox, sid = self._inbox, reply.session_id
        await self._persist("inbox_done_mark", lambda: inbox.finish(sid, set(reply.entries), reply=reply.id))

    async def _resend(self, reply: PendingReply) -> _Delivery:
        """Send ``reply`` again with growing pauses for up to ``send_patience`` seconds. "refused": a
        refusal for good ends the wait at once; "failed": the patience ran out, or a shutdown began."""
        deadline = time.monotonic() + self._send_patience
        attempt = 0
        while time.monotonic() + (pause := self._retry(attempt)) <= deadline:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._closing.wait()
            if self._closing.is_set():  # shutting down: the next start sends it
                return "failed"
            attempt += 1
            outcome = await self._send_out(reply.outbound())
            if outcome == "sent":
                log.info("reply_sent_late", channel=reply.channel, chat_id=reply.chat_id, attempts=attempt)
            if outcome != "failed":
                return outcome
        log.error("reply_kept_for_next_start", channel=reply.channel, chat_id=reply.chat_id, attempts=attempt)
        return "failed"

    async def _persist(
        self,
        what: str,
        write: Callable[[], Awaitable[object]],
        *,
        notice: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``write`` again with growing pauses while storage refuses it (a full disk frees up; a
        shutdown cancels the wait, and the inbox then has the work for the next start). ``notice``
        tells the user once, so a chat that waits is not a chat that seems dead."""
        try:
            await write()
            return
        except (StorageError, OSError) as exc:
            log.error("storage_write_failed_retrying", what=what, error=str(exc))
        if notice is not None:
            await notice()
        await asyncio.sleep(self._retry(0))
        await retry(
            write,
            retry_if=lambda exc, _: isinstance(exc, StorageError | OSError),
            wait=lambda _, tries: self._retry(tries),
        )
        log.info("storage_write_recovered", what=what)

    async def _send(self, to: InboundMessage, text: str, *, error: bool = False) -> None:
        """A command's reply or a notice: beside whatever turn the chat is running."""
        await self._send_out(
            OutboundMessage(to.channel, to.chat_id, text, reply_to=to.message_id, is_error=error, aside=True)
        )

    async def _send_out(self, out: OutboundMessage) -> _Delivery:
        channel = self._channels.get(out.channel)
        if channel is None:
            log.error("reply_without_channel", channel=out.channel, chat_id=out.chat_id)
            return "failed"
        try:
            await channel.send(out)
        except ChannelRefused as exc:  # no traceback: the platform's answer is the whole story
            log.error(
                "reply_refused",
                channel=out.channel,
                chat_id=out.chat_id,
                reason=exc.reason,
                fix=exc.fix,
                error=str(exc),
            )
            return "refused"
        except Exception:
            log.exception("reply_failed", channel=out.channel, chat_id=out.chat_id)
            return "failed"
        return "sent"

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
        return len(lane.queue) if lane else 0

    def total_queued(self) -> int:
        return sum(len(lane.queue) for lane in self._lanes.values())

    def running_turns(self) -> int:
        """Turns not finished yet, bookkeeping after the send included (the metrics gauge)."""
        return sum(1 for lane in self._lanes.values() if lane.turn is not None and not lane.turn.done())

    async def stop(self, sid: str) -> int | None:
        lane = self._lanes.get(sid)
        if lane is None or lane.stopping is not None:
            return None
        if lane.turn is None or lane.turn.done():
            return await self._stop_waiting(sid, lane) if lane.model_wait is not None else None
        kept = [q for q in lane.queue if isinstance(q, _Queued)]
        lane.queue = deque(q for q in lane.queue if not isinstance(q, _Queued))
        request = lane.stopping = _Stop(list(lane.batch), kept)
        lane.turn.cancel()
        await request.done  # the worker did the bookkeeping (see _Stop)
        return len(kept)

    async def _stop_waiting(self, sid: str, lane: _Lane) -> int:
        """/stop while the chat waits for the model: no more tries. Its messages are kept in the history
        unanswered, as /stop keeps queued ones (the waiting ones are there already)."""
        assert lane.model_wait is not None
        lane.model_wait.wake()  # the worker finds nothing to try and ends
        lane.model_wait = None
        kept = [q for q in lane.queue if isinstance(q, _Queued)]
        lane.queue = deque(q for q in lane.queue if not isinstance(q, _Queued))
        request = _Stop([], kept)
        async with lane.lock:  # taken before the worker can take it again (asyncio.Lock is fair)
            await self._stopped(sid, lane, request)
            if self._waits is not None:
                await self._waits.end(sid)
        log.info("model_wait_stopped", chat_id=lane.chat_id, kept=len(kept))
        return len(kept)

    async def _stopped(self, sid: str, lane: _Lane, request: _Stop) -> None:
        """/stop's bookkeeping, in the worker under the lane's lock: the kept messages go into the
        history unanswered, and the inbox entries of all of them need no answer any more."""
        try:
            async with self._sessions.lease(lane.channel, lane.chat_id) as session:
                if request.kept:
                    for queued in request.kept:
                        if not queued.in_session:
                            session.append(intake.user_message(queued.message, queued.entries))
                    await self._sessions.save(session)
                if self._inbox is not None:  # the user asked: these need no answer any more
                    entries = {e for q in request.stopped + request.kept for e in q.entries}
                    await self._inbox.finish(sid, entries)
        except BaseException as exc:
            request.done.set_exception(exc)
            request.done.exception()  # retrieved: /stop may be gone (a shutdown)
            raise
        request.done.set_result(None)

    @contextlib.asynccontextmanager
    async def exclusive(self, sid: str) -> AsyncIterator[None]:
        """See :class:`~bot.commands.SessionControl`. A command that has to wait is kept in the inbox
        (its line queued now, before anything the chat sends after it) and marked done once it ran,
        before the lane goes on: a restart never runs it again after what came next."""
        channel, _, chat = sid.partition(":")
        lane = self._lane(sid, channel, chat)
        command = self._commands_running.get(asyncio.current_task())  # type: ignore[arg-type]
        if command is not None and command.entry is None and lane.lock.locked():
            if self._inbox is not None:
                command.entry, command.durable = self._inbox.add(command.call.message)
            command.placed.set()  # it waits: ``submit`` returns (the place is taken below, at once)
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
        self._closing.set()
        workers = [lane.worker for lane in self._lanes.values() if lane.worker and not lane.worker.done()]
        workers += self._commands_running  # a /new waiting for a turn runs once that turn ended
        for lane in self._lanes.values():
            lane.queue.clear()  # still pending in the inbox: finished on the next start
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


def _next_command(lane: _Lane) -> _KeptCommand | None:
    """The kept command to run now, taken out of the queue: the one at its head or, while the chat waits
    for the model, the first one queued (a command does not wait for the model, as before the restart)."""
    head = lane.queue[0]
    if isinstance(head, _KeptCommand):
        lane.queue.popleft()
        return head
    if lane.model_wait is not None:
        for item in lane.queue:
            if isinstance(item, _KeptCommand):
                lane.queue.remove(item)
                return item
    return None


def _reply_text(turn: Turn) -> tuple[str, bool]:
    """The reply and whether it reports a failure. A failure is told in plain words chosen by its
    type: its text names servers, settings and exception types, which belong in the log (where the
    pipeline put it, secrets redacted), not in a chat."""
    notes = "\n\n".join(f"_{note}_" for note in turn.notes)
    if turn.reply and turn.reply.strip():  # a blank answer is no answer: channels drop or mangle it
        return (turn.reply + (f"\n\n{notes}" if notes else "")), False
    if turn.failures:
        reason = plain_reason((model_failure(turn) or turn.failures[-1]).kind)
    elif turn.notes:
        reason = " ".join(turn.notes)
    else:
        reason = "the model returned an empty answer"
    text = (
        f"⚠️ Sorry, I couldn't answer this time ({reason}). "
        "Your message is saved — send another message to try again."
    )
    return text, True
