"""A lane's worker: it takes the chat's queued work in order and runs it, one turn at a time.

A turn leases the session, adds the batch's messages, runs the pipeline and saves the messages with
the answer before the answer is sent (bot/dispatcher/delivery.py); what the chat is told is worded in
bot/dispatcher/replies.py. A turn the model could not answer for now is kept to try again later
(bot/model_wait.py), and a /stop's bookkeeping is done here, by the worker, before anything else takes
the lane. Saved answers from before a restart (queued by
recovery) and commands that wait for a turn (/new, /compact: queued as they arrive, or by recovery)
take their place in the same order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Protocol

import structlog

from bot import intake
from bot.config import DispatcherSettings
from bot.dispatcher.delivery import Delivery
from bot.dispatcher.lanes import (
    Command,
    KeptCommand,
    Lane,
    Queued,
    Stop,
    next_command,
    one_turn,
    take_messages,
    take_unanswered,
)
from bot.dispatcher.replies import (
    LOAD_STORAGE_NOTICE,
    STOP_STORAGE_NOTICE,
    STORAGE_NOTICE,
    crash_notice,
    pending_reply,
)
from bot.domain import Session, utcnow
from bot.inbox import Inbox
from bot.model_wait import NOTICE as MODEL_NOTICE
from bot.model_wait import ModelWait, WaitRecords, model_failure, waits_for_model
from bot.outbox import PendingReply
from bot.ports import ChannelPort
from bot.retry import Backoff
from bot.session_service import SessionService
from pipeline import Pipeline, Turn

log = structlog.get_logger(__name__)


class TurnObserver(Protocol):
    """Told about every finished turn (metrics)."""

    def turn_finished(self, channel: str, outcome: str, seconds: float) -> None: ...


class Turns:
    """Runs the lanes' work. ``run_kept`` runs a command that waits for its chat's turn (queued now, or
    when the last run ended) and returns once it ran (commands are answered in bot/dispatcher/commands.py);
    ``completed`` counts the finished turns since start. ``clock`` is the machine's, which dates the
    messages (bot/intake.py: never before the session's last one) and the answers kept to send."""

    def __init__(
        self,
        pipeline: Pipeline,
        sessions: SessionService,
        settings: DispatcherSettings,
        channels: Mapping[str, ChannelPort],
        delivery: Delivery,
        run_kept: Callable[[KeptCommand | Command], Awaitable[None]],
        *,
        inbox: Inbox | None = None,
        waits: WaitRecords | None = None,
        observer: TurnObserver | None = None,
        noted: int = intake.COMMANDS_NOTED,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._pipeline = pipeline
        self._sessions = sessions
        self._settings = settings
        self._channels = channels
        self._delivery = delivery
        self._run_kept = run_kept
        self._inbox = inbox
        self._waits = waits
        self._observer = observer
        self._noted = noted  # the latest messages taken a session notes (see bot.intake.add_message)
        self._clock = clock
        self.completed = 0

    async def work(self, sid: str, lane: Lane) -> None:
        """The lane's worker: runs until its queue is empty."""
        while lane.queue:
            if (kept := next_command(lane)) is not None:  # it takes the lane itself (exclusive)
                await self._run_kept(kept)
                continue
            if lane.model_wait is not None:  # outside the lock: commands (/new, /compact) run meanwhile
                await lane.model_wait.until_next_try()
            async with lane.lock:
                if not lane.queue:
                    break
                head = lane.queue[0]
                if isinstance(head, KeptCommand | Command):  # (left at the head by a /stop of the wait)
                    continue
                if isinstance(head, PendingReply):  # a saved answer from before a restart
                    lane.queue.popleft()
                    await self._delivery.deliver(head, lane)
                    continue
                if unanswered := take_unanswered(lane):  # kept by a /stop, behind a command that ran
                    await self._stopped(sid, lane, Stop([], unanswered))
                    continue
                batch: list[Queued] = []
                while lane.queue and isinstance(queued := lane.queue[0], Queued) and not queued.unanswered:
                    lane.queue.popleft()
                    batch.extend(queued.messages())
                    if self._settings.mode != "collect":
                        break
                lane.overflow_noticed = False
                lane.batch, lane.answered = batch, False
                lane.turn = asyncio.create_task(self._run_turn(lane, batch), name=f"turn:{sid}")
                try:
                    await lane.turn
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise  # the worker itself is being cancelled (shutdown)
                    # else: the turn was stopped by /stop, whose bookkeeping follows below
                except Exception as exc:
                    log.exception("turn_crashed", session_id=sid)
                    if not lane.answered and lane.stopping is None:  # no answer saved to go out
                        await self._delivery.send(batch[0].message, crash_notice(exc), error=True)
                finally:
                    lane.turn = None
                    request, lane.stopping = lane.stopping, None
                    if request is not None:
                        await self._wait_over(sid, lane)  # /stop of a try: no more tries
                        await self._stopped(sid, lane, request)

    async def _run_turn(self, lane: Lane, batch: list[Queued]) -> None:
        started = time.perf_counter()
        outcome = "ok"
        first = batch[0].message
        channel = self._channels.get(lane.channel)
        entries = tuple(e for q in batch for e in q.entries)
        await self._readable(
            first.session_id, lambda: self._delivery.send(first, LOAD_STORAGE_NOTICE, error=True)
        )
        async with self._sessions.lease(lane.channel, lane.chat_id) as session:
            structlog.contextvars.bind_contextvars(session_id=session.id, channel=lane.channel)
            try:
                # A message the session held when it was queued may be gone since (a /new while the lane
                # waited for the model): it is added again, or the answer would not know the question.
                held = intake.entries_in(session.messages) if any(q.in_session for q in batch) else set()
                for queued in batch:
                    if not (queued.in_session and held.issuperset(queued.entries)):
                        intake.add_message(
                            session, queued.message, queued.entries, keep=self._noted, now=self._clock()
                        )
                turn = Turn(
                    session=session,
                    inbound=tuple(q.message for q in batch),
                    on_partial=channel.partial_sink(lane.chat_id, first.message_id) if channel else None,
                    now=intake.turn_time((q.message for q in batch), session, self._clock()),
                )
                lane.answering = turn
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
                    # inbox entries stay pending and the next start answers them. An answer the model
                    # gave (a shutdown cut the systems after it; /stop leaves such a turn alone) is in
                    # the history and memory: it is saved to be sent then, as after a kill, not asked
                    # for again (the chat got a second answer, and the history held both).
                    given = (
                        [pending_reply(lane, turn, entries, self._clock())[0]]
                        if entries and turn.answered
                        else []
                    )
                    await asyncio.shield(self._save(session, turn, replies=given))
                    raise
                if (
                    outcome == "ok"
                    and waits_for_model(turn)
                    and await self._wait_for_model(lane, batch, session, turn)
                ):
                    outcome = "waiting"
                    return
                # Final from here (see answer_final): it is saved and sent whatever /stop says.
                lane.answered = True
                if lane.model_wait is not None:
                    waited = time.monotonic() - lane.model_wait.since
                    log.info(
                        "turn_retried",
                        chat_id=lane.chat_id,
                        attempts=lane.model_wait.attempts + 1,
                        waited_seconds=round(waited, 1),
                        answered=turn.answered,
                    )
                    await self._wait_over(session.id, lane)
                reply, is_error = pending_reply(lane, turn, entries, self._clock())
                if is_error and outcome == "ok":
                    outcome = "error"
                # The answer is on disk before it is sent: a crash from here on resends, never re-asks.
                # A full disk holds the chat here until the save goes through (nothing else is lost).
                await self._delivery.persist(
                    "session_save",
                    session.id,
                    lambda: self._save(session, turn, replies=[reply] if entries else []),
                    notice=lambda: self._delivery.send(first, STORAGE_NOTICE, error=True),
                )
                self.completed += 1
                log.info("turn_finished", outcome=outcome, failures=len(turn.failures))
                await self._delivery.deliver(reply, lane)
            except Exception:
                outcome = "error"  # crashed (turn_crashed): /metrics counted it as answered ("ok")
                raise
            finally:
                lane.answering = None
                if self._observer is not None:
                    self._observer.turn_finished(lane.channel, outcome, time.perf_counter() - started)
                structlog.contextvars.unbind_contextvars("session_id", "channel", "turn_id")

    async def _readable(self, sid: str, notice: Callable[[], Awaitable[None]]) -> None:
        """Read ``sid``'s session (into the cache, unless there is none yet) again with growing pauses
        while storage refuses it, ``notice`` telling the chat once, as a save is written again: the
        lease that follows then finds it. A read the disk refused crashed the turn, and the chat was
        told its message waited for a restart, even once storage was back."""
        sessions = self._sessions
        await self._delivery.persist("session_load", sid, lambda: sessions.get(sid), notice=notice)

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

    async def _wait_for_model(self, lane: Lane, batch: list[Queued], session: Session, turn: Turn) -> bool:
        """Keep a turn the model could not answer for now, to try it again later (bot/model_wait.py);
        ``False`` once the chat has waited ``model_retry_max_age``: the turn then fails as any other.

        The turn's messages (and what it did) are saved in the session, unanswered, and go back to the
        head of the queue as one turn; their inbox entries stay pending, so a restart meanwhile answers
        them once, in one turn (``Dispatcher.recover``). The chat is told once, at the first failure; the
        notice is an aside, never the answer. The wait is recorded before the notice goes out, so a
        restart goes on with it without telling again."""
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
        await self._delivery.persist(
            "session_save", session.id, lambda: self._save(session, turn, replies=[])
        )
        for queued in batch:
            queued.in_session = True
        lane.queue.appendleft(one_turn(batch))  # before what arrived meanwhile: the order holds
        first_failure, lane.model_wait = lane.model_wait is None, wait
        log.warning(
            "turn_waiting_for_model", chat_id=lane.chat_id, attempt=wait.attempts, next_try_in=round(pause, 1)
        )
        if first_failure:
            if self._waits is not None:
                await self._waits.begin(batch[0].message.session_id, [e for q in batch for e in q.entries])
            await self._delivery.send(batch[0].message, MODEL_NOTICE)
        return True

    async def _wait_over(self, sid: str, lane: Lane) -> None:
        """The chat waits for the model no more (answered, given up, or /stop): a restart starts afresh."""
        lane.model_wait = None
        if self._waits is not None:
            await self._waits.end(sid)

    async def stop_waiting(self, sid: str, lane: Lane) -> int:
        """/stop while the chat waits for the model: no more tries. Its messages are kept in the history
        unanswered, as /stop keeps queued ones (the waiting ones are there already)."""
        assert lane.model_wait is not None
        lane.model_wait.wake()  # the worker finds nothing to try and ends
        lane.model_wait = None
        kept, later = take_messages(lane)
        request = Stop([], kept)
        async with lane.lock:  # taken before the worker can take it again (asyncio.Lock is fair)
            await self._stopped(sid, lane, request)
            await self._wait_over(sid, lane)  # (its lane.model_wait went above, for the worker)
        log.info("model_wait_stopped", chat_id=lane.chat_id, kept=len(kept) + later)
        return len(kept) + later

    async def _stopped(self, sid: str, lane: Lane, request: Stop) -> None:
        """/stop's bookkeeping, in the worker under the lane's lock: the stopped and the kept messages go
        into the history unanswered (those not there yet: a turn stopped before it stored its batch, or
        a /new that cleared them, left them out), and their inbox entries need no answer any more.

        A write the disk refuses is written again until it goes through, as a turn's save is (the chat
        told once): given up, the messages stayed pending and the next start answered what was stopped.
        """
        stopped_or_kept = request.stopped + request.kept
        told = not stopped_or_kept  # (a /stop with nothing to keep has no message to answer)

        async def tell() -> None:
            nonlocal told
            if not told:
                told = True
                await self._delivery.send(stopped_or_kept[0].message, STOP_STORAGE_NOTICE, error=True)

        try:
            await self._readable(sid, tell)
            async with self._sessions.lease(lane.channel, lane.chat_id) as session:
                held = intake.entries_in(session.messages)
                stopped = [q for q in request.stopped if not _in_history(q, session, held, assumed=True)]
                kept = [q for q in request.kept if not _in_history(q, session, held, assumed=q.in_session)]
                missing = stopped + kept
                for queued in missing:
                    intake.add_message(
                        session, queued.message, queued.entries, keep=self._noted, now=self._clock()
                    )
                if missing or request.kept:
                    await self._delivery.persist(
                        "stop_save", sid, lambda: self._sessions.save(session), notice=tell
                    )
                if self._inbox is not None:  # the user asked: these need no answer any more
                    inbox, entries = self._inbox, {e for q in stopped_or_kept for e in q.entries}
                    await self._delivery.persist(
                        "inbox_done_mark", sid, lambda: inbox.finish(sid, entries), notice=tell
                    )
        except BaseException as exc:
            request.done.set_exception(exc)
            request.done.exception()  # retrieved: /stop may be gone (a shutdown)
            raise
        request.done.set_result(None)


def _in_history(queued: Queued, session: Session, held: set[str], *, assumed: bool) -> bool:
    """Whether ``queued`` is in the session's history already: by its inbox entries, else by its platform
    message id, else ``assumed`` (no inbox, no id: nothing to tell by)."""
    if queued.entries:
        return set(queued.entries) <= held
    if queued.message.message_id:
        return intake.already_taken(session.messages, queued.message.message_id)
    return assumed
