"""Routes inbound messages to sessions: one turn at a time per session, nothing dropped.

For every session (``<channel>:<chat>``) there is a lane: a queue and at most one running turn.
Messages that arrive during a turn wait in order; when the turn ends, the queued messages are taken
together as the next turn's input (``collect`` mode) or one by one (``per_message``). Commands skip the
queue and are answered at once, even while a slow turn runs. Different sessions run concurrently.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import structlog

from bot.commands import CommandRouter
from bot.config import DispatcherSettings
from bot.domain import ImagePart, InboundMessage, Message, OutboundMessage, Role, Session, utcnow
from bot.errors import LLMError, plain_reason
from bot.inbox import Inbox
from bot.sessions import SessionService
from channels.base import Channel
from pipeline import Pipeline, Turn

log = structlog.get_logger(__name__)


class TurnObserver(Protocol):
    """Told about every finished turn (metrics)."""

    def turn_finished(self, channel: str, outcome: str, seconds: float) -> None: ...


@dataclass(slots=True)
class _Queued:
    message: InboundMessage
    entries: list[str] = field(default_factory=list)  # inbox entry ids folded into this message


@dataclass(slots=True)
class _Lane:
    channel: str
    chat_id: str
    queue: deque[_Queued] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    worker: asyncio.Task[None] | None = None
    turn: asyncio.Task[None] | None = None
    overflow_noticed: bool = False


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
    ) -> None:
        self._pipeline = pipeline
        self._sessions = sessions
        self._commands = commands
        self._settings = settings
        self._inbox = inbox
        self._max_chars = max_inbound_chars
        self._observer = observer
        self._channels: dict[str, Channel] = {}
        self._lanes: dict[str, _Lane] = {}
        self._accepting = True
        self.turns_completed = 0  # finished turns since start (tests and operators wait on it)

    # -- wiring -----------------------------------------------------------------------------------

    def attach(self, channel: Channel) -> None:
        self._channels[channel.name] = channel

    @property
    def channels(self) -> dict[str, Channel]:
        return dict(self._channels)

    # -- intake -----------------------------------------------------------------------------------

    async def submit(self, message: InboundMessage) -> None:
        """Accept a message: answer a command at once, otherwise queue it (durably) for its session."""
        if not self._accepting:
            await self._send(message, "I'm restarting — please send that again in a minute.", error=True)
            return
        message = self._bounded(message)
        call = self._commands.parse(message)
        if call is not None:
            try:
                reply = await self._commands.handle(call, self)
            except Exception:
                log.exception("command_failed", command=call.name, session_id=message.session_id)
                reply = f"/{call.name} failed; the details are in the log."
            await self._send(message, reply)
            return
        entry_id, durable = self._inbox.add(message) if self._inbox else (None, None)
        notice = self._enqueue(_Queued(message, [entry_id] if entry_id else []))  # order fixed here
        if durable is not None:
            await durable
        if notice is not None:
            await notice

    async def recover(self) -> int:
        """Queue again what a previous run accepted but never took into a session."""
        if self._inbox is None:
            return 0
        entries = await self._inbox.load_pending()
        count = 0
        for entry in entries:
            session = await self._sessions.get(entry.message.session_id)
            if session and any(m.meta.get("inbox") == entry.entry_id for m in session.messages[-200:]):
                await self._inbox.ack(entry.message.session_id, {entry.entry_id})
                continue
            notice = self._enqueue(_Queued(entry.message, [entry.entry_id]))
            if notice is not None:
                await notice
            count += 1
        if count:
            log.info("inbox_recovered", messages=count)
        return count

    def _bounded(self, message: InboundMessage) -> InboundMessage:
        if len(message.text) <= self._max_chars:
            return message
        note = f"\n\n[message truncated: {len(message.text)} characters, limit {self._max_chars}]"
        return dataclasses.replace(message, text=message.text[: self._max_chars] + note)

    def _enqueue(self, queued: _Queued) -> Awaitable[None] | None:
        """Queue without awaiting (so arrival order is kept); returns the overflow notice to await."""
        sid = queued.message.session_id
        lane = self._lanes.get(sid)
        if lane is None:
            lane = self._lanes[sid] = _Lane(queued.message.channel, queued.message.chat_id)
        notice: Awaitable[None] | None = None
        if len(lane.queue) >= self._settings.queue_limit:
            # Never drop: fold the overflow into the newest queued message and tell the user once.
            last = lane.queue[-1]
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
        if lane.worker is None or lane.worker.done():
            lane.worker = asyncio.create_task(self._work(sid, lane), name=f"lane:{sid}")
        return notice

    # -- turns ------------------------------------------------------------------------------------

    async def _work(self, sid: str, lane: _Lane) -> None:
        while lane.queue:
            async with lane.lock:
                if not lane.queue:
                    break
                if self._settings.mode == "collect":
                    batch = list(lane.queue)
                    lane.queue.clear()
                else:
                    batch = [lane.queue.popleft()]
                lane.overflow_noticed = False
                lane.turn = asyncio.create_task(self._run_turn(lane, batch), name=f"turn:{sid}")
                try:
                    await lane.turn
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise  # the worker itself is being cancelled (shutdown)
                    # else: the turn was stopped by /stop; stop() does the bookkeeping
                except Exception:
                    log.exception("turn_crashed", session_id=sid)
                finally:
                    lane.turn = None

    async def _run_turn(self, lane: _Lane, batch: list[_Queued]) -> None:
        started = time.perf_counter()
        outcome = "ok"
        first = batch[0].message
        channel = self._channels.get(lane.channel)
        async with self._sessions.lease(lane.channel, lane.chat_id) as session:
            structlog.contextvars.bind_contextvars(session_id=session.id, channel=lane.channel)
            try:
                await self._take_into_session(session, batch)
                turn = Turn(
                    session=session,
                    inbound=tuple(q.message for q in batch),
                    on_partial=channel.partial_sink(lane.chat_id) if channel else None,
                    now=turn_time(q.message for q in batch),
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
                    await asyncio.shield(self._sessions.save(session))
                    raise
                await self._sessions.save(session)
                self.turns_completed += 1
                text, is_error = _reply_text(turn)
                if is_error and outcome == "ok":
                    outcome = "error"
                log.info("turn_finished", outcome=outcome, failures=len(turn.failures))
                await self._send(first, text, error=is_error)
            finally:
                if self._observer is not None:
                    self._observer.turn_finished(lane.channel, outcome, time.perf_counter() - started)
                structlog.contextvars.unbind_contextvars("session_id", "channel", "turn_id")

    async def _take_into_session(self, session: Session, batch: list[_Queued]) -> None:
        """Write the user's messages into the session and save, then release them from the inbox."""
        for queued in batch:
            session.append(_user_message(queued))
        await self._sessions.save(session)
        if self._inbox is not None:
            await self._inbox.ack(session.id, {e for q in batch for e in q.entries})

    async def _send(self, to: InboundMessage, text: str, *, error: bool = False) -> None:
        channel = self._channels.get(to.channel)
        if channel is None:
            log.error("reply_without_channel", channel=to.channel, chat_id=to.chat_id)
            return
        out = OutboundMessage(to.channel, to.chat_id, text, reply_to=to.message_id, is_error=error)
        try:
            await channel.send(out)
        except Exception:
            log.exception("reply_failed", channel=to.channel, chat_id=to.chat_id)

    # -- SessionControl (used by commands) ----------------------------------------------------------

    def is_running(self, sid: str) -> bool:
        lane = self._lanes.get(sid)
        return bool(lane and lane.turn and not lane.turn.done())

    def queue_depth(self, sid: str) -> int:
        lane = self._lanes.get(sid)
        return len(lane.queue) if lane else 0

    def total_queued(self) -> int:
        return sum(len(lane.queue) for lane in self._lanes.values())

    def running_turns(self) -> int:
        return sum(1 for sid in self._lanes if self.is_running(sid))

    async def stop(self, sid: str) -> int | None:
        lane = self._lanes.get(sid)
        if lane is None or lane.turn is None or lane.turn.done():
            return None
        kept = list(lane.queue)
        lane.queue.clear()
        turn = lane.turn
        turn.cancel()
        await asyncio.wait({turn}, timeout=5)
        if kept:
            async with lane.lock, self._sessions.lease(lane.channel, lane.chat_id) as session:
                await self._take_into_session(session, kept)
        return len(kept)

    @contextlib.asynccontextmanager
    async def exclusive(self, sid: str) -> AsyncIterator[None]:
        lane = self._lanes.get(sid)
        if lane is None:
            channel, _, chat = sid.partition(":")
            lane = self._lanes[sid] = _Lane(channel, chat)
        async with lane.lock:
            yield

    # -- shutdown ---------------------------------------------------------------------------------

    async def close(self, grace: float) -> None:
        """Stop taking messages, let running turns finish for ``grace`` seconds, then cancel the rest.

        Queued messages that never ran stay in the inbox and are answered after the next start.
        """
        self._accepting = False
        workers = [lane.worker for lane in self._lanes.values() if lane.worker and not lane.worker.done()]
        for lane in self._lanes.values():
            lane.queue.clear()  # still in the inbox: recovered on the next start
        if workers:
            _, pending = await asyncio.wait(workers, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
        for session in self._sessions.cached_sessions():
            if session.rewrite_needed or session.persisted_count != len(session.messages):
                await self._sessions.save(session)


def turn_time(messages: Iterable[InboundMessage]) -> datetime:
    """When a turn happens: the date of its newest message, as its platform dated it, so memory files
    and recalls what was said at the time it was said. A date ahead of our clock (a skewed sender) is
    taken as now; a date without a zone is read as UTC."""
    now = utcnow()
    newest = max((_aware(m.timestamp) for m in messages), default=now)
    return min(newest, now)


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _user_message(queued: _Queued) -> Message:
    inbound = queued.message
    parts = [inbound.text] if inbound.text else []
    images: list[ImagePart] = []
    for attachment in inbound.attachments:
        if attachment.kind == "image" and attachment.data:
            images.append(ImagePart(attachment.mime_type, base64.b64encode(attachment.data).decode("ascii")))
            parts.append(f"[image: {attachment.name}]")
        elif attachment.kind == "text":
            body = attachment.data.decode("utf-8", errors="replace")
            parts.append(f"[file {attachment.name}]\n{body}")
        else:
            size = f"{attachment.mime_type}, {attachment.size} bytes"
            parts.append(f"[file {attachment.name} ({size}) received]")
    meta: dict[str, object] = {"sender_id": inbound.sender_id}
    if inbound.sender_name:
        meta["sender_name"] = inbound.sender_name
    if inbound.message_id:
        meta["message_id"] = inbound.message_id
    if queued.entries:
        meta["inbox"] = queued.entries[0] if len(queued.entries) == 1 else ",".join(queued.entries)
    return Message(
        role=Role.USER,
        content="\n\n".join(parts),
        timestamp=inbound.timestamp,
        images=tuple(images),
        meta=meta,
    )


def _reply_text(turn: Turn) -> tuple[str, bool]:
    """The reply and whether it reports a failure. A failure is told in plain words chosen by its
    type: its text names servers, settings and exception types, which belong in the log (where the
    pipeline put it, secrets redacted), not in a chat."""
    notes = "\n\n".join(f"_{note}_" for note in turn.notes)
    if turn.reply:
        return (turn.reply + (f"\n\n{notes}" if notes else "")), False
    if turn.failures:
        model_failure = next((f for f in turn.failures if issubclass(f.kind, LLMError)), None)
        reason = plain_reason((model_failure or turn.failures[-1]).kind)
    elif turn.notes:
        reason = " ".join(turn.notes)
    else:
        reason = "the model returned an empty answer"
    text = (
        f"⚠️ Sorry, I couldn't answer this time ({reason}). "
        "Your message is saved — send another message to try again."
    )
    return text, True
