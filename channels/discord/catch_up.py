"""Catching up at every fresh gateway session on what users wrote in the bot's chats while it was away.

Telegram keeps updates while a bot is down; Discord does not: a session that starts with IDENTIFY (a
start, a deploy, a crash, or a connection that could not RESUME) replays nothing. So at each READY
after IDENTIFY (discord.py's ``on_connect``; a RESUME replays missed events itself and is left alone)
every chat the bot talks in (:class:`~channels.discord.seen.SeenMarks`) has its history read after the
newest message seen there, up to the session's start (what comes later arrives live), and each message
goes down the live path, oldest first: the same access checks and mention rules, the same normalized
message, the same durable hand-over. A message that arrives both live and in the history is taken
once, since the dispatcher takes a platform message id once (``Dispatcher.submit``: the inbox, then
the session).

Chats it never tracked are read too, when something was written there since the bot was last connected
(:mod:`channels.discord.unseen`: guild channels and active threads whose newest message is newer than
the seen marks' ``connected_until``; quiet ones cost no request). A chat where one of them is handed
over is tracked from then on. The point moves past the gap only once every untracked chat was read (or
refused for good) with all guilds in view; otherwise the next fresh session reads it again. A DM from
a user the bot never talked with cannot be reached this way (a bot cannot list its DMs), and at the
very first start (no point yet) nothing untracked is read.

Bounded: at most ``discord.catch_up_max_messages`` per chat written before the session started, none
older than ``discord.catch_up_max_age``. When more were written, the newest are taken (the ones people
still wait for) and the older ones skipped; the mark moves past all of them, and the log counts what was
skipped (``discord_catch_up_limit_reached``, and ``discord_catch_up_too_old`` for the too old). What was
written in the minute after the start (the host's clock may lag Discord's) is taken besides, never
counted against the limit: a live message held at the gate cannot push out what was missed. A chat whose
history cannot be read is logged and skipped (one the bot lost for good is no longer tracked); the
others and the bot go on. The work runs as a task: the bot is ready at once, and only the live
messages of a chat still being caught up wait, so that chat's messages stay in order.

    catch_up = CatchUp(settings, seen, live_client, take_in, lock_of)
    catch_up.session_started()         # on_connect: sync, before any later gateway event is handled
    catch_up.session_ready()           # on_ready: guild channels are known
    while (gate := catch_up.gate(chat_id)) is not None:  # the live path, before the chat's lock
        await gate.wait()
    await catch_up.close()
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import timedelta

import aiohttp
import discord
import structlog

from bot.config import DiscordSettings
from bot.errors import ChannelRefused
from channels.discord.inbound import DiscordAccess
from channels.discord.outbound import describe
from channels.discord.refusals import as_channel_error
from channels.discord.seen import SeenMarks
from channels.discord.unseen import MARGIN, untracked_chats

log = structlog.get_logger(__name__)

CONCURRENCY = 4  # chats read at once: enough to be quick, few enough to stay clear of rate limits

Readable = discord.abc.Messageable


@dataclass(frozen=True, slots=True)
class Missed:
    """What a chat's history holds after the mark, as far as it was read."""

    messages: tuple[discord.Message, ...]  # to take in: the newest young enough, oldest first (bot's too)
    newest_id: int | None  # the newest message read, too old or not
    too_old: int
    too_old_at_least: bool  # more too-old messages were left unread
    skipped: int  # young enough, but older than the ``limit`` newest: not taken in
    skipped_at_least: bool  # more of them were left unread


async def read_missed(where: Readable, after: int, start: int, *, limit: int, max_age: float) -> Missed:
    """The newest ``limit`` young enough messages written between ``after`` and the session's ``start``,
    then every message of the margin after it, oldest first; the others only counted.

    The newest, because those are the ones people still wait for. One request when no more than
    ``limit`` were written up to the margin's end (an empty page for a quiet chat). Past that, a second
    request reads the newest young enough ones before ``start``: Discord pages ``after`` a point from its
    oldest end, so discord.py reads down from ``start`` and drops what is not after the point. The young
    enough messages older than those are skipped and counted, exactly when the two reads meet, else as
    many as they saw. So after a long absence the end of the last day is answered, however much was
    written before it.

    Only what was written before ``start`` competes for the limit. What came later arrives live, behind
    the chat's gate; but ``start`` is the host's clock, so the margin after it (:data:`MARGIN`) may still
    hold messages Discord wrote before the session. A third request reads them all, and they are taken
    after the rest: what also arrives live is then a duplicate the dispatcher drops, and nothing newer
    than them is read. Live messages thus never push what was missed out of the newest nor go out of order.
    """
    cutoff = discord.utils.utcnow() - timedelta(seconds=max_age) if max_age > 0 else None
    young = after if cutoff is None else max(after, discord.utils.time_snowflake(cutoff, high=True))
    end = discord.Object(start + MARGIN)
    first = [m async for m in where.history(limit=limit + 1, after=discord.Object(after), before=end)]
    too_old = sum(m.id <= young for m in first)
    if len(first) <= limit:  # all that was written since the mark
        fresh = tuple(m for m in first if m.id > young)
        return Missed(fresh, first[-1].id if first else None, too_old, False, 0, False)
    newer, older = discord.Object(young), discord.Object(start)
    top = [m async for m in where.history(limit=limit + 1, after=newer, before=older, oldest_first=False)]
    since = discord.Object(max(young, start - 1))
    margin = [m async for m in where.history(limit=None, after=since, before=end)]
    taken = (*reversed(top[:limit]), *margin)
    skipped = {m.id for m in (*first, *top) if young < m.id < start} - {m.id for m in taken}
    gap = len(top) > limit and first[-1].id < top[limit].id  # unread messages may lie between the reads
    newest = max(m.id for m in (first[-1], *top[:1], *margin[-1:]))
    return Missed(taken, newest, too_old, first[-1].id <= young, len(skipped), gap)


async def open_chat(client: discord.Client, chat_id: int) -> Readable:
    """The chat as discord.py knows it: guild channels and threads from the cache, DMs from Discord."""
    found = client.get_channel(chat_id)
    if isinstance(found, Readable):
        return found
    fetched = await client.fetch_channel(chat_id)
    if not isinstance(fetched, Readable):
        raise TypeError(f"channel {chat_id} has no messages ({type(fetched).__name__})")
    return fetched


class CatchUp:
    """Runs the catch-up of every fresh session (see the module doc); owned by the Discord channel.

    Args:
        settings: the bounds (``catch_up_max_messages``: 0 turns the catch-up off; ``catch_up_max_age``).
        seen: the marks; the catch-up moves them as it takes messages in.
        client: the live discord.py client.
        take_in: the live path for any message taken from the history (the bot's own included: it skips
            them as live), called under the chat's lock; true when the message was handed to the dispatcher.
        lock_of: the chat's intake lock, which the live path holds too.
    """

    def __init__(
        self,
        settings: DiscordSettings,
        seen: SeenMarks,
        client: Callable[[], discord.Client],
        take_in: Callable[[discord.Message], Awaitable[bool]],
        lock_of: Callable[[str], AbstractAsyncContextManager[None]],
    ) -> None:
        self._limit = settings.catch_up_max_messages
        self._max_age = settings.catch_up_max_age
        self._timeout = settings.start_timeout  # for READY, and for reading one chat
        self._seen = seen
        self._client = client
        self._take_in = take_in
        self._lock_of = lock_of
        self._access = DiscordAccess(settings)
        self._gates: dict[str, asyncio.Event] = {}  # chats being caught up: their live messages wait
        # Set once the session's untracked chats are known (and gated): until then a live message of a
        # chat the session did not start tracking waits, in case that chat has to be read first.
        self._planned = asyncio.Event()
        self._planned.set()
        self._tracked: frozenset[str] = frozenset()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def session_started(self) -> None:
        """A READY after IDENTIFY. Synchronous on purpose: the gates are up before discord.py hands
        over any later event, so a chat's live messages come after what it missed."""
        if self._limit == 0:
            return
        if self._task is not None:
            self._task.cancel()  # a session replaced before its catch-up ended: its chats are read again
        since = self._seen.begin()
        for chat_id in since:
            self._gates.setdefault(chat_id, asyncio.Event())
        self._tracked = frozenset(since)
        self._planned.set()  # whoever waited on the replaced session's plan asks again
        self._planned = asyncio.Event()
        if self._seen.connected_until is None:
            self._planned.set()  # the first start: nothing untracked is read
        started = discord.utils.time_snowflake(discord.utils.utcnow())
        self._ready = asyncio.Event()
        self._task = asyncio.create_task(
            self._run(since, started, self._ready, self._planned), name="discord-catch-up"
        )

    def session_ready(self) -> None:
        self._ready.set()

    def gate(self, chat_id: str) -> asyncio.Event | None:
        """What a live message of ``chat_id`` waits for before it takes the chat's lock (None: nothing).
        Ask again once it is set: a chat is known to need no catch-up only once the plan is made."""
        gate = self._gates.get(chat_id)
        if gate is None and chat_id not in self._tracked and not self._planned.is_set():
            return self._planned
        return gate

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for gate in (*self._gates.values(), self._planned):  # nothing waits for a channel that stopped
            gate.set()
        self._gates.clear()

    async def _run(
        self, since: dict[str, int], started: int, ready: asyncio.Event, planned: asyncio.Event
    ) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await ready.wait()
        except TimeoutError:
            log.warning("discord_catch_up_without_ready", waited=self._timeout)
        whole = ready.is_set()  # the guilds were all looked at: the gap is covered once this ends
        try:
            untracked = self._plan(since)
        except Exception:  # a bug: the tracked chats are still read, and the next session plans again
            log.exception("discord_catch_up_failed", chat_id=None)
            untracked, whole = {}, False
        finally:
            planned.set()
        slots = asyncio.Semaphore(CONCURRENCY)

        async def one(chat_id: str, after: int, *, tracked: bool) -> bool:
            covered = False
            async with self._lock_of(chat_id):
                try:
                    covered = await self._chat(chat_id, after, started, slots, tracked=tracked)
                except Exception:  # a bug, or a hand-over given up: logged, and the other chats go on
                    log.exception("discord_catch_up_failed", chat_id=chat_id)
                    self._seen.caught_up(chat_id)
                # Not when cancelled: the session that replaced this one keeps the gate until it is done.
                self._open(chat_id)
            return covered

        _, read = await asyncio.gather(
            asyncio.gather(*(one(chat_id, after, tracked=True) for chat_id, after in since.items())),
            asyncio.gather(*(one(chat_id, after, tracked=False) for chat_id, after in untracked.items())),
        )
        # Only a whole view covers the gap: with READY missing, a guild unavailable (an outage on
        # Discord's side) or an untracked chat not read (a 5xx), some messages were never looked at, so
        # the point stays and the next fresh session looks again.
        if whole and all(read) and not any(guild.unavailable for guild in self._client().guilds):
            self._seen.connected_through(started)

    def _plan(self, since: dict[str, int]) -> dict[str, int]:
        """The untracked chats to read and the point each is read after; their gates go up at once."""
        until = self._seen.connected_until
        if until is None:
            return {}
        after = max(until - MARGIN, 0)
        chats = untracked_chats(self._client(), tracked=since, after=after, heard=self._access.may_hear)
        untracked = {str(chat.id): after for chat in chats}
        for chat_id in untracked:
            self._gates.setdefault(chat_id, asyncio.Event())
        for chat_id in [c for c in self._gates if c not in since and c not in untracked]:
            self._open(chat_id)  # planned by a replaced session and not needed now
        log.info("discord_catch_up_planned", tracked=len(since), untracked=len(untracked))
        return untracked

    async def _chat(
        self, chat_id: str, after: int, started: int, slots: asyncio.Semaphore, *, tracked: bool
    ) -> bool:
        """Read what ``chat_id`` missed after ``after`` up to the session's start (:func:`read_missed`) down
        the live path; false when it could not be read for now. ``slots`` bounds the reading only: a
        message taken in may wait for as long as pairing.json cannot be read, and 4 such DMs held every
        other chat's catch-up, and the live messages at its gate, until the operator fixed the file."""
        try:
            async with slots, asyncio.timeout(self._timeout):
                where = await open_chat(self._client(), int(chat_id))
                missed = await read_missed(where, after, started, limit=self._limit, max_age=self._max_age)
        except (discord.HTTPException, aiohttp.ClientError, TimeoutError, TypeError) as exc:
            return self._unreadable(chat_id, exc)
        taken = 0
        for message in missed.messages:
            handed = await self._take_in(message)
            taken += handed
            if handed and not tracked:  # tracked from now on, as a live one would make it
                self._seen.saw(chat_id, message.id, start=True)
            self._seen.caught_up_to(chat_id, message.id)
        if missed.newest_id is not None:
            self._seen.caught_up_to(chat_id, missed.newest_id)  # past the too-old and the bot's own
        self._seen.caught_up(chat_id)
        log.info(
            "discord_caught_up",
            chat_id=chat_id,
            tracked=tracked,
            read=len(missed.messages) + missed.too_old,
            handed_over=taken,
            too_old=missed.too_old,
            skipped=missed.skipped,
        )
        if missed.too_old:
            log.warning(
                "discord_catch_up_too_old",
                chat_id=chat_id,
                skipped=missed.too_old,
                at_least=missed.too_old_at_least,
                max_age=self._max_age,
                hint="older than discord.catch_up_max_age: not answered",
            )
        if missed.skipped:
            log.warning(
                "discord_catch_up_limit_reached",
                chat_id=chat_id,
                read=self._limit,
                skipped=missed.skipped,
                at_least=missed.skipped_at_least,
                hint="more messages were written while the bot was down than discord.catch_up_max_messages "
                "reads: the newest were answered, the older ones skipped; raise it if this chat is that busy",
            )
        return True

    def _unreadable(self, chat_id: str, exc: BaseException) -> bool:
        """Log why; true when the chat is refused for good (nothing there to wait for)."""
        refused = as_channel_error(f"cannot read Discord channel {chat_id}", exc)
        if isinstance(refused, ChannelRefused):
            self._seen.forget(chat_id)  # tracked again once the bot answers there
            log.warning(
                "discord_catch_up_failed",
                chat_id=chat_id,
                error=describe(exc),
                reason=refused.reason,
                fix=refused.fix,
            )
            return True
        self._seen.caught_up(chat_id)
        log.warning("discord_catch_up_failed", chat_id=chat_id, error=describe(exc))
        return False

    def _open(self, chat_id: str) -> None:
        gate = self._gates.pop(chat_id, None)
        if gate is not None:
            gate.set()
