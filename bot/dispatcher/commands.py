"""A chat's commands: taken once, answered at once beside its turn, or in their place in its lane.

A command is taken once per platform id, as a message is: a redelivery is found in the inbox while it
waits, or in its session's note of the commands run there (bot/intake.py). Most commands answer at once,
even while a slow turn runs; one that must wait for the turn (/new, /compact: :meth:`Commands.exclusive`)
takes its place in the lane's queue, is kept in the inbox meanwhile, and is run there by the lane's
worker (bot/dispatcher/turns.py) through :meth:`Commands.run_kept`. Such a command is kept in the inbox
even when it runs at once, and its reply is kept there before the lane goes on, then sent as an answer
is: noted as run, the command is not run again after a kill, so its reply must not depend on that.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping

import structlog

from bot import intake
from bot.commands import CommandCall, CommandRouter, SessionControl
from bot.dispatcher.delivery import Delivery
from bot.dispatcher.lanes import Command, KeptCommand, Lane, messages_ahead
from bot.domain import Session
from bot.errors import StorageError
from bot.inbox import Inbox
from bot.outbox import PendingReply
from bot.session_service import SessionService

log = structlog.get_logger(__name__)

# The reply of a command that ran just before a kill, its own reply not kept yet (see run_kept).
RAN_BEFORE_RESTART = "/{name} is done."


class Commands:
    """Answers the commands the dispatcher takes in (:meth:`submit`), and runs those that wait for
    their chat's lane when their place comes (:meth:`run_kept`, called by the lane's worker).

    The dispatcher composes it: ``control`` is what the command handlers see (the dispatcher itself),
    ``lanes`` the chats' lanes, ``lane`` returns a chat's lane (made if new: ``sid``, channel, chat id),
    and ``wake`` starts a lane's worker once its channel is ready; a session notes the latest
    ``noted`` commands run in it (see :data:`bot.intake.COMMANDS_NOTED`). ``tasks`` are the commands
    being answered, which shutdown waits for.
    """

    def __init__(
        self,
        router: CommandRouter,
        control: SessionControl,
        sessions: SessionService,
        delivery: Delivery,
        lanes: Mapping[str, Lane],
        lane: Callable[[str, str, str], Lane],
        wake: Callable[[str, Lane], None],
        *,
        inbox: Inbox | None = None,
        noted: int = intake.COMMANDS_NOTED,
    ) -> None:
        self._router = router
        self._control = control
        self._sessions = sessions
        self._delivery = delivery
        self._lanes = lanes
        self._lane = lane
        self._wake = wake
        self._inbox = inbox
        self._noted = noted
        # Commands being answered; one that waits for its chat's running turn (/new, /compact) sets its
        # ``placed`` once it holds its place in the lane: from then on ``submit`` need not wait for it.
        self._running: dict[asyncio.Task[None], Command] = {}

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The commands being answered now."""
        return list(self._running)

    def _note(self, session: Session, message_id: str) -> None:
        intake.note_command(session, message_id, keep=self._noted)

    async def submit(self, call: CommandCall) -> None:
        """Take ``call`` and answer it, unless it is a redelivery of a command taken before."""
        taken, noted = await self._take(call)
        if not taken:
            log.info(
                "duplicate_command_ignored", session_id=call.session_id, message_id=call.message.message_id
            )
            return
        await self._command(call, noted)

    async def _take(self, call: CommandCall) -> tuple[bool, Session | None]:
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
        task, command = self._start(call, noted=noted)
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
        if not task.done() and self._control.is_running(call.session_id):  # (not a sent reply's bookkeeping)
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

    def _start(
        self, call: CommandCall, *, entry: str | None = None, noted: Session | None = None
    ) -> tuple[asyncio.Task[None], Command]:
        task = asyncio.create_task(self._answer(call), name=f"command:{call.name}:{call.session_id}")
        command = self._running[task] = Command(call, task, entry=entry, noted=noted)
        task.add_done_callback(lambda t: self._running.pop(t, None))
        return task, command

    async def run_kept(self, waiting: KeptCommand | Command) -> None:
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
                # It ran and its session was saved, but a kill came before its reply was kept in the
                # inbox (that comes before the send): the chat was never told, and is now.
                log.info("duplicate_command_ignored", session_id=call.session_id, message_id=message_id)
                await self._entry_done(call.session_id, waiting.entry)
                await self._delivery.send(call.message, RAN_BEFORE_RESTART.format(name=call.name))
                return
            task, _ = self._start(call, entry=waiting.entry, noted=session)
        else:
            if session is not None and message_id is not None:
                self._note(session, message_id)
            task = waiting.task
            waiting.reached.set()
        await asyncio.wait([task])

    async def _answer(self, call: CommandCall) -> None:
        current = asyncio.current_task()
        command = self._running.get(current) if current else None
        if command is not None and command.noted is not None and call.message.message_id is not None:
            # Noted before it acts, with no wait until it either acts or, if it has to wait for its
            # turn, takes the note back (exclusive): a save meanwhile must not note a command that
            # is not kept in the inbox yet.
            self._note(command.noted, call.message.message_id)
        kept: PendingReply | None = None
        try:
            try:
                reply = await self._router.handle(call, self._control)
            except Exception:
                log.exception("command_failed", command=call.name, session_id=call.session_id)
                reply = f"/{call.name} failed; the details are in the log."
            kept = await self._keep_reply(command, reply)
        finally:
            if command is not None and command.unlock is not None:  # (cancelled before its reply was kept)
                unlock, command.unlock = command.unlock, None
                unlock()
        await self._done(command)  # (done already if it waited for the lane: see exclusive)
        if command is not None and command.noted is not None:
            await self._save_note(command.noted)
        if kept is None:
            await self._delivery.send(call.message, reply)
        else:  # sent as an answer is: its inbox entry is done once the platform took it
            await self._delivery.deliver(kept, self._lane(call.session_id, kept.channel, kept.chat_id))

    async def _keep_reply(self, command: Command | None, text: str) -> PendingReply | None:
        """Keep the reply of a command that ran kept in the inbox (see :meth:`exclusive`) there, in
        place of its done mark, then let its lane go on: the next start sends it, should a kill (or a
        platform outage) come before it went out. Noted as run with what it did, the command is not run
        again after a restart; its reply was lost then, and the chat never learnt its conversation was
        cleared. ``None``: not kept (the command holds no lane, or no inbox entry)."""
        if command is None or command.unlock is None or command.entry is None or self._inbox is None:
            return None
        message, inbox = command.call.message, self._inbox
        reply = PendingReply(
            message.channel, message.chat_id, text, (command.entry,), reply_to=message.message_id, aside=True
        )
        await self._delivery.persist("reply_keep", message.session_id, lambda: inbox.keep(reply))
        command.entry = None  # (finished with its reply)
        return reply

    async def keep(self) -> bool:
        """Keep the command this task answers in the inbox, if it is not yet, so that the next start
        runs it again should a kill come before it is done (one that takes its lane, before it acts; a
        command whose write waits for storage, before the chat is told it will be finished). False when
        the inbox could not take it: nothing may promise that then. A command run again finds its
        session as its last save left it, so it does its work once (/new's retirement skips what the
        archive holds)."""
        command = self._running.get(asyncio.current_task())  # type: ignore[arg-type]
        if command is None or command.entry is not None or self._inbox is None:
            return True
        command.entry, durable = self._inbox.add(command.call.message)
        try:
            await durable
        except (StorageError, OSError):
            command.entry = None
            log.warning("command_not_kept", session_id=command.call.session_id, exc_info=True)
            return False
        return True

    async def _save_note(self, session: Session) -> None:
        """Put the note of a command that changed nothing (/help, /status) on disk before its reply, as a
        turn's answer is: a platform's redelivery after a kill is then not answered again, and the
        session is not held in the cache until the shutdown saves it. While a turn holds the session,
        the note goes with that turn's save or the next one, as after a save that failed: the session
        counts as unsaved until then (``Session.unsaved``)."""
        try:
            await self._sessions.save_if_idle(session)
        except StorageError:
            log.warning("command_note_not_saved", session_id=session.id, exc_info=True)

    async def _done(self, command: Command | None) -> None:
        """A kept command ran (or failed for good): the next start must not run it again."""
        if command is None or command.entry is None:
            return
        entry, command.entry = command.entry, None
        await self._entry_done(command.call.session_id, entry)

    async def _entry_done(self, sid: str, entry: str) -> None:
        if self._inbox is not None:
            inbox = self._inbox
            await self._delivery.persist("inbox_done_mark", sid, lambda: inbox.finish(sid, {entry}))

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
        command = self._running.get(asyncio.current_task())  # type: ignore[arg-type]
        busy = lane.lock.locked() or (bool(lane.queue) and lane.model_wait is None)
        if command is not None and command.entry is None and busy:
            message_id = command.call.message.message_id
            if command.noted is not None and message_id is not None:
                intake.forget_command(command.noted, message_id)  # noted again when its place comes
            if self._inbox is not None:
                command.entry, command.durable = self._inbox.add(command.call.message)
            lane.queue.append(command)
            command.placed.set()  # it waits: ``submit`` returns
            self._wake(sid, lane)
            await command.reached.wait()
        await lane.lock.acquire()
        held = True
        try:
            if command is not None and command.entry is None:  # (the lane is free: it runs now)
                await self.keep()  # before it acts, so its reply can be kept in its place (_keep_reply)
            try:
                yield
            except Exception:
                await self._done(command)  # it failed: a restart would not do better
                raise
            if command is not None and command.entry is not None and self._inbox is not None:
                # The lane goes on once the reply is kept in the inbox in place of the done mark.
                command.unlock, held = lane.lock.release, False
            else:
                await self._done(command)
        finally:
            if held:
                lane.lock.release()
