"""Delivering replies to Discord: chunks, reply references, locked-down mentions, retries and streaming.

A reply is split under the 2000-character limit at paragraph and line boundaries, never inside a code
block (:mod:`channels.chunking`); the first chunk replies to the user's message. Mentions are locked
down: never ``@everyone`` or roles, and of users only the author being answered. Server errors and
network failures are retried with backoff (discord.py itself waits out 429s); each chunk carries a
nonce Discord enforces for a few minutes, so a retry after a lost answer never posts twice (an
interaction's follow-ups cannot carry one: before a retry the channel is searched for the part instead,
see ``_follow_up``). How far a keyed answer got, and the preview a streamed answer is shown in, are
noted on disk (:mod:`channels.discord.sent`): sent again, after a failure or a restart, the answer goes
on from the part it reached, and into its preview rather than below it.
What still fails is logged with its channel id and raised as :class:`~bot.errors.ChannelError`, never
dropped silently; as :class:`~bot.errors.ChannelRefused` when Discord refuses the channel for good (the
user closed their DMs, the bot lost access: :mod:`channels.discord.refusals`).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import discord
import structlog

from bot.config import DiscordSettings
from bot.domain import OutboundMessage
from bot.errors import ChannelError, ChannelRefused
from bot.retry import Backoff, retry
from channels.base import ChannelHealth, PartialSink, while_running
from channels.chunking import split_message
from channels.discord.refusals import as_channel_error
from channels.discord.sent import sent_parts
from channels.streaming import StreamedMessage
from channels.tables import tables_as_code

log = structlog.get_logger(__name__)

LIMIT = 2000
_TYPING_EVERY = 8.0  # Discord shows "typing" for 10 s after each trigger
# Interaction tokens live 15 minutes from the interaction; past 14 after its "thinking" (sent within 3 s
# of it) the answer goes to the channel: an edit then was refused (401) or left its follow-ups to be.
_INTERACTION_TTL = 14 * 60.0
_REMEMBERED = 1024
_UNKNOWN_MESSAGE = 10008  # Discord's code for a message that is gone (deleted)
# Worth another try: the service or the network failed, not our request.
TRANSIENT = (discord.DiscordServerError, discord.RateLimited, aiohttp.ClientError, OSError, TimeoutError)
_T = TypeVar("_T")


class DiscordOutbox:
    """Everything the Discord channel sends (see the module doc).

    It also remembers what replies need from the inbound side: who wrote a message (to allow pinging
    only them), each chat's latest message (for a streamed reply's reference) and the slash-command
    interactions still waiting for their answer. The parts and previews of answers not yet done are
    kept in ``sent_file`` (:mod:`channels.discord.sent`; ``None``: in memory only): :meth:`open` before
    the first send, :meth:`close` at the channel's stop.
    """

    def __init__(
        self,
        settings: DiscordSettings,
        health: ChannelHealth,
        client: Callable[[], discord.Client],
        clock: Callable[[], float],
        sent_file: Path | None = None,
    ) -> None:
        self._settings = settings
        self._health = health
        self._client = client
        self._clock = clock
        self._interactions: dict[str, tuple[discord.Interaction, float]] = {}
        self._authors: OrderedDict[str, int] = OrderedDict()  # message id -> author id
        self._last_inbound: dict[str, str] = {}  # chat id -> last message id
        self._streams: dict[str, StreamedMessage[int, str]] = {}  # chat id -> the stream of its turn
        # The preview of each chat's answer (kept until that answer went out, so a second try of it, in
        # this run or the next, goes on in it) and the parts of answers cut short.
        self._sent = sent_parts(sent_file)

    def received(self, chat_id: str, message_id: str, author_id: int) -> None:
        self._authors[message_id] = author_id
        while len(self._authors) > _REMEMBERED:
            self._authors.popitem(last=False)
        self._last_inbound[chat_id] = message_id

    def awaiting_answer(self, key: str, interaction: discord.Interaction) -> None:
        """An interaction deferred under ``key`` (the inbound message id); the reply will answer it."""
        now = self._clock()
        for stale in [k for k, (_, at) in self._interactions.items() if now - at > _INTERACTION_TTL]:
            del self._interactions[stale]
        self._interactions[key] = (interaction, now)

    async def open(self) -> None:
        await self._sent.load()

    async def close(self) -> None:
        """The channel stops: what was in flight is forgotten; the answers not yet done stay on disk."""
        self._interactions.clear()
        self._streams.clear()
        await self._sent.close()

    async def send(self, message: OutboundMessage) -> None:
        chunks = split_message(tables_as_code(message.text), LIMIT)  # Discord shows no tables
        if not chunks:
            log.warning("discord_empty_reply", channel_id=message.chat_id)
            return
        key = message.key
        first = self._sent.get(key) if key else 0  # sent again (maybe after a restart): only the rest
        pending = self._interactions.pop(message.reply_to, None) if message.reply_to else None
        if pending is not None and self._clock() - pending[1] > _INTERACTION_TTL:
            log.info("discord_interaction_expired", channel_id=message.chat_id)  # (no request is tried)
            pending = None
        if pending is not None and not first:
            # what the interaction could not carry goes to the channel
            first = await self._answer_interaction(pending[0], chunks, message.chat_id)
            if key and 0 < first < len(chunks):
                await self._sent.record(key, first)
        author = self._authors.get(message.reply_to or "")
        mentions = discord.AllowedMentions(
            everyone=False,
            roles=False,
            users=[discord.Object(author)] if author else False,
            replied_user=author is not None,
        )
        target = self._client().get_partial_messageable(int(message.chat_id))
        stream = None if message.aside else self._streams.pop(message.chat_id, None)
        preview = stream.message if stream is not None else None
        if preview is None and not message.aside:  # an earlier try's, or one a kill left in the chat
            preview = self._sent.preview(message.chat_id, message.reply_to)
        # An answer sent again keeps its nonces, so Discord drops a part it took minutes ago (enforce_nonce).
        nonce = hashlib.sha256(key.encode()).hexdigest()[:16] if key else secrets.token_hex(8)
        for index in range(first, len(chunks)):
            chunk = chunks[index]
            streamed = preview if index == 0 else None
            if streamed is None or not await self._finish_stream(streamed, chunk, message.chat_id):
                # also when the preview is gone (deleted)
                reference = _reference(message.reply_to, message.chat_id) if index == 0 else None

                def post(chunk: str = chunk, ref: Any = reference, n: str = f"mb{nonce}{index:03d}") -> Any:
                    # The nonce makes a retry after a lost answer idempotent (enforce_nonce).
                    return target.send(chunk, reference=ref, allowed_mentions=mentions, nonce=n)

                await self.deliver(message.chat_id, post)
            if key and index + 1 < len(chunks):
                await self._sent.record(key, index + 1)
        if key:
            self._sent.finished(key)
        if not message.aside:
            self._sent.preview_done(message.chat_id, message.reply_to)
        self._health.sent += 1

    async def _answer_interaction(
        self, interaction: discord.Interaction, chunks: list[str], chat_id: str
    ) -> int:
        """Replace the deferred "thinking" with the reply, then follow up; returns the chunks delivered."""
        none = discord.AllowedMentions.none()
        answered = 0
        try:
            original = await self.deliver(
                chat_id, lambda: interaction.edit_original_response(content=chunks[0], allowed_mentions=none)
            )
            answered, last = 1, original.id
            for chunk in chunks[1:]:
                last = await self._follow_up(interaction, chunk, chat_id, after=last)
                answered += 1
        except ChannelError:
            log.warning("discord_interaction_reply_failed", channel_id=chat_id, delivered=answered)
        return answered

    async def _follow_up(
        self, interaction: discord.Interaction, text: str, chat_id: str, *, after: int
    ) -> int:
        """Post one follow-up of an interaction's answer; returns its message id.

        Discord takes no nonce on this path (Execute Webhook has none; ``enforce_nonce`` exists only for
        channel messages), so a retry after an answer lost on its way back would post the part twice.
        Before a retry, the channel's messages since ``after`` (the previous part) are searched for it
        instead. Where the bot may not read the channel, it is posted again: twice is better than never.
        """
        none = discord.AllowedMentions.none()
        tried = False

        async def post() -> int:
            nonlocal tried
            if tried and (landed := await self._posted_since(chat_id, after, text, interaction)) is not None:
                log.info("discord_followup_already_posted", channel_id=chat_id, message_id=landed)
                return landed
            tried = True
            message = await interaction.followup.send(text, allowed_mentions=none, wait=True)
            return message.id

        return await self.deliver(chat_id, post)

    async def _posted_since(
        self, chat_id: str, after: int, text: str, interaction: discord.Interaction
    ) -> int | None:
        """The id of a message of this interaction's application posted with ``text`` after ``after``.
        A failure to read that may pass (5xx, network) is raised, so the retry asks again."""
        target = self._client().get_partial_messageable(int(chat_id))
        try:
            async for message in target.history(after=discord.Object(after), limit=100):
                if message.webhook_id == interaction.application_id and message.content == text.strip():
                    return message.id
        except discord.HTTPException as exc:
            if exc.status >= 500:
                raise
            log.warning("discord_followup_unverified", channel_id=chat_id, error=describe(exc))
        return None

    async def deliver(self, chat_id: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """Run one Discord request; retry 5xx and network failures with backoff (the library retries 429)."""
        retries = self._settings.send_retries
        backoff = Backoff(self._settings.send_retry_delay, 30.0)
        tries = 0

        async def once() -> _T:
            nonlocal tries
            tries += 1
            return await call()

        def note(exc: Exception, tried: int, delay: float) -> None:
            log.warning("discord_send_retry", channel_id=chat_id, attempt=tried, error=describe(exc))

        try:
            return await retry(
                once,
                retry_if=lambda exc, tried: isinstance(exc, TRANSIENT) and tried <= retries,
                wait=lambda exc, tried: backoff(tried - 1),
                on_retry=note,
            )
        except (*TRANSIENT, discord.DiscordException) as exc:  # 4xx: another try would be refused too
            raise self._failed(chat_id, exc, tries) from exc

    def _failed(self, chat_id: str, exc: BaseException, attempts: int) -> ChannelError:
        self._health.send_failures += 1
        error = as_channel_error(
            f"Discord request for channel {chat_id} failed after {attempts} tries: {describe(exc)}", exc
        )
        if isinstance(error, ChannelRefused) and error.by_user:  # their DMs closed: nothing to fix here
            log.warning(
                "discord_send_refused_by_user", channel_id=chat_id, reason=error.reason, error=describe(exc)
            )
        else:
            log.error("discord_send_failed", channel_id=chat_id, attempts=attempts, error=describe(exc))
        return error

    # -- typing and streaming ---------------------------------------------------------------------

    def typing(self, chat_id: str) -> AbstractAsyncContextManager[None]:
        return while_running(self._keep_typing(chat_id), name=f"discord-typing:{chat_id}")

    async def _keep_typing(self, chat_id: str) -> None:
        target = self._client().get_partial_messageable(int(chat_id))
        while True:
            try:
                await target.typing()
            except (discord.DiscordException, aiohttp.ClientError, OSError) as exc:
                log.debug("discord_typing_failed", channel_id=chat_id, error=describe(exc))
            await asyncio.sleep(_TYPING_EVERY)

    def partial_sink(self, chat_id: str, reply_to: str | None = None) -> PartialSink | None:
        if not self._settings.streaming:
            return None

        errors = (discord.DiscordException, aiohttp.ClientError, OSError)

        def first_chunk(text_so_far: str) -> str | None:
            return (split_message(text_so_far, LIMIT - 2) or [""])[0] or None  # room for " …"

        def target() -> discord.PartialMessageable:
            return self._client().get_partial_messageable(int(chat_id))

        async def post(preview: str) -> int:
            earlier = self._sent.preview(chat_id, reply_to)
            if earlier is not None:  # an earlier try of this answer (maybe before a restart): go on in it
                try:
                    await target().get_partial_message(earlier).edit(content=preview + " …")
                    return earlier
                except discord.NotFound as exc:  # deleted: a new preview takes its place
                    if exc.code != _UNKNOWN_MESSAGE:
                        raise
            # The message being answered, not the chat's latest (a question sent meanwhile).
            ref = _reference(reply_to or self._last_inbound.get(chat_id), chat_id)
            options: dict[str, Any] = {"reference": ref} if ref is not None else {}
            message = await target().send(preview + " …", **options)
            await self._sent.record_preview(chat_id, reply_to, message.id)  # on disk before the answer
            return message.id

        async def edit(message_id: int, preview: str) -> None:
            await target().get_partial_message(message_id).edit(content=preview + " …")

        def failed(exc: Exception) -> None:
            log.warning("discord_stream_failed", channel_id=chat_id, error=describe(exc))

        stream = self._streams[chat_id] = StreamedMessage(
            render=first_chunk,
            shown_as=lambda preview: preview,
            post=post,
            edit=edit,
            interval=self._settings.stream_edit_interval,
            clock=self._clock,
            errors=errors,
            on_error=failed,
            keep_trying=False,  # no more previews; the final reply still goes into the one on record
        )
        return stream.show

    async def _finish_stream(self, message_id: int, chunk: str, chat_id: str) -> bool:
        """Edit the answer's first part into its preview. False: the preview is gone (deleted) or could
        not be edited, and the part is to be sent as a new message."""
        preview = self._client().get_partial_messageable(int(chat_id)).get_partial_message(message_id)

        async def edit() -> bool:
            try:
                await preview.edit(content=chunk)
            except discord.NotFound as exc:
                if exc.code != _UNKNOWN_MESSAGE:
                    raise
                log.warning("discord_preview_gone", channel_id=chat_id, message_id=message_id)
                return False
            return True

        try:
            return await self.deliver(chat_id, edit)
        except ChannelError:
            return False


def _reference(message_id: str | None, chat_id: str) -> discord.MessageReference | None:
    if not message_id or not message_id.isdigit():
        return None
    return discord.MessageReference(
        message_id=int(message_id), channel_id=int(chat_id), fail_if_not_exists=False
    )


def describe(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    if isinstance(exc, discord.HTTPException):
        return f"HTTP {exc.status} (code {exc.code}): {exc.text or exc}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
