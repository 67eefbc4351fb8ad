"""The Discord channel: discord.py's gateway client in membot's event loop, DMs, guild channels and threads.

Each Discord channel id is a conversation (``discord:<channel_id>``; a DM, a guild channel and every
thread are separate sessions). The library keeps the gateway alive (heartbeats, RESUME after drops,
429 retries); this adapter decides who is heard (:mod:`channels.discord_inbound`), hands messages to
the dispatcher in arrival order, answers slash commands (:mod:`channels.discord_commands`) and
delivers replies in chunks under Discord's 2000-character limit without losing one silently.

    channel = DiscordChannel(settings.discord, dispatcher.submit, pairing=store,
                             commands=router.commands, vision_supported=lambda: True,
                             state_dir=settings.workspace / "state")
    dispatcher.attach(channel)
    await channel.start()    # returns once the gateway is READY; ChannelError if it cannot be
    ...
    await channel.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import aiohttp
import discord
import structlog
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

from bot.config import DiscordSettings
from bot.domain import InboundMessage, OutboundMessage
from bot.errors import ChannelError, ConfigError
from bot.pairing import PairingStore
from channels.base import Channel, InboundSink, PartialSink
from channels.chunking import split_message
from channels.discord_commands import interaction_text, sync_commands
from channels.discord_inbound import DiscordAccess, Place, addresses_bot, read_attachments, readable_text

log = structlog.get_logger(__name__)

LIMIT = 2000
_TYPING_EVERY = 8.0  # Discord shows "typing" for 10 s after each trigger
_INTERACTION_TTL = 14 * 60.0  # interaction tokens live 15 minutes
_REMEMBERED = 1024
# Worth another try: the service or the network failed, not our request.
_TRANSIENT = (discord.DiscordServerError, discord.RateLimited, aiohttp.ClientError, OSError, TimeoutError)
_T = TypeVar("_T")


@dataclass(slots=True)
class _Stream:
    """The one message a streamed reply is shown in while the model writes."""

    message: discord.Message | None = None
    last_edit: float = -math.inf
    shown: str = ""
    broken: bool = False


class DiscordChannel(Channel):
    """Discord over the gateway (see the module doc). ``start`` logs in and waits for READY."""

    name: ClassVar[str] = "discord"

    def __init__(
        self,
        settings: DiscordSettings,
        submit: InboundSink,
        *,
        pairing: PairingStore | None,
        commands: list[tuple[str, str]],
        vision_supported: Callable[[], bool],
        state_dir: Path,
        clock: Callable[[], float] = time.monotonic,
        guild_ready_timeout: float = 2.0,
    ) -> None:
        super().__init__(submit)
        if settings.token is None:
            raise ConfigError("Discord needs a bot token: set MEMBOT_DISCORD__TOKEN or [discord] token")
        self._settings = settings
        self._token = settings.token.get_secret_value()
        self._pairing = pairing if settings.pairing else None
        self._commands = commands
        self._vision_supported = vision_supported
        self._state_dir = state_dir
        self._clock = clock
        self._guild_ready_timeout = guild_ready_timeout
        self._access = DiscordAccess(settings)
        self._client: _GatewayClient | None = None
        self._gateway: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._restore_library: Callable[[], None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._intake: dict[str, asyncio.Lock] = {}
        self._interactions: dict[str, tuple[discord.Interaction, float]] = {}
        self._authors: OrderedDict[str, int] = OrderedDict()  # message id -> author id
        self._last_inbound: dict[str, str] = {}  # chat id -> last message id
        self._streams: dict[str, _Stream] = {}

    @property
    def client(self) -> discord.Client:
        if self._client is None:
            raise ChannelError("the Discord channel is not started")
        return self._client

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        self.health.state = "starting"
        self._ready.clear()
        self._restore_library = _point_library_at(self._settings.api_base, self._settings.gateway_url)
        intents = discord.Intents.default()
        intents.message_content = True
        self._client = _GatewayClient(
            self,
            intents=intents,
            allowed_mentions=discord.AllowedMentions.none(),
            guild_ready_timeout=self._guild_ready_timeout,
        )
        self._gateway = asyncio.create_task(self._client.start(self._token), name="discord-gateway")
        ready = asyncio.create_task(self._ready.wait())
        try:
            await asyncio.wait(
                {self._gateway, ready},
                timeout=self._settings.start_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ready.cancel()
        if not self._ready.is_set():
            error = _startup_error(self._gateway, self._settings.start_timeout)
            await self.stop()
            self.health.state, self.health.error = "failed", str(error)
            raise error
        self._gateway.add_done_callback(self._gateway_ended)
        self.health.state = "running"
        if self._settings.sync_commands:
            self._spawn(self._sync_commands(), "discord-commands")
        log.info("discord_started", user=str(self._client.user))

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
        if self._gateway is not None:
            await asyncio.gather(self._gateway, return_exceptions=True)
        if self._restore_library is not None:
            self._restore_library()
            self._restore_library = None
        self._interactions.clear()
        self.health.state = "stopped"

    def _gateway_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._client is None or self._client.is_closed():
            return
        error = task.exception()
        self.health.state, self.health.error = "failed", f"Discord gateway stopped: {error}"
        log.error("discord_gateway_stopped", error=str(error))

    async def _sync_commands(self) -> None:
        try:
            await sync_commands(self.client, self._commands, self._state_dir)
        except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
            log.warning("discord_commands_not_registered", error=str(exc))

    def _spawn(self, work: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(work)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- inbound ----------------------------------------------------------------------------------

    async def _on_message(self, message: discord.Message) -> None:
        bot = self.client.user
        if bot is None or message.author.bot or message.author.id == bot.id:
            return
        if message.type not in (discord.MessageType.default, discord.MessageType.reply):
            return
        chat_id = str(message.channel.id)
        # FIFO lock taken before any await: messages of one chat reach the dispatcher in order.
        async with self._intake.setdefault(chat_id, asyncio.Lock()):
            guild_id = message.guild.id if message.guild else getattr(message.channel, "guild_id", None)
            place = Place.of(message.channel, guild_id)
            user_id = str(message.author.id)
            if not await self._admitted(user_id, message.author.display_name, place, message):
                return
            if self._access.requires_mention(place) and not addresses_bot(message, bot.id):
                return
            text = readable_text(message, bot.id)
            attachments = await read_attachments(
                message,
                max_bytes=self._settings.max_attachment_bytes,
                vision_supported=self._vision_supported,
            )
            if not text and not attachments:
                return
            self._remember(str(message.id), message.author.id)
            self._last_inbound[chat_id] = str(message.id)
            await self.handle_inbound(
                InboundMessage(
                    channel=self.name,
                    chat_id=chat_id,
                    sender_id=user_id,
                    text=text,
                    sender_name=message.author.display_name,
                    message_id=str(message.id),
                    timestamp=message.created_at,
                    attachments=attachments,
                    is_group=not place.is_dm,
                )
            )

    async def _admitted(
        self, user_id: str, user_name: str, place: Place, message: discord.Message | None
    ) -> bool:
        """Allowed by the allowlists or a pairing; an unknown DM user is offered a pairing code."""
        if self._access.admits(user_id, place):
            return True
        if not place.is_dm or self._pairing is None:
            log.info("discord_message_denied", user_id=user_id, channel_id=place.channel_id)
            return False
        if await self._pairing.is_approved(self.name, user_id):
            return True
        if message is not None:
            code = await self._pairing.request(self.name, user_id, user_name)
            await self._deliver(place.channel_id, lambda: message.channel.send(_pairing_text(code)))
        return False

    async def _on_interaction(self, interaction: discord.Interaction) -> None:
        text = interaction_text(interaction)
        if text is None or interaction.channel_id is None:
            return
        user = interaction.user
        channel: Any = interaction.channel or discord.Object(interaction.channel_id)
        place = Place.of(channel, interaction.guild_id)
        if not await self._admitted(str(user.id), user.display_name, place, None):
            await self._deliver(place.channel_id, lambda: _refuse(interaction, place, self._pairing, user))
            return
        # Discord wants an answer within 3 s: show "thinking" now, edit it when the reply is ready.
        await self._deliver(place.channel_id, lambda: interaction.response.defer(thinking=True))
        key = f"interaction:{interaction.id}"
        now = self._clock()
        for stale in [k for k, (_, at) in self._interactions.items() if now - at > _INTERACTION_TTL]:
            del self._interactions[stale]
        self._interactions[key] = (interaction, now)
        await self.handle_inbound(
            InboundMessage(
                channel=self.name,
                chat_id=place.channel_id,
                sender_id=str(user.id),
                text=text,
                sender_name=user.display_name,
                message_id=key,
                timestamp=interaction.created_at,
                is_group=not place.is_dm,
            )
        )

    def _remember(self, message_id: str, author_id: int) -> None:
        self._authors[message_id] = author_id
        while len(self._authors) > _REMEMBERED:
            self._authors.popitem(last=False)

    # -- outbound ---------------------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> None:
        chunks = split_message(message.text, LIMIT)
        if not chunks:
            log.warning("discord_empty_reply", channel_id=message.chat_id)
            return
        pending = self._interactions.pop(message.reply_to, None) if message.reply_to else None
        if pending is not None and await self._answer_interaction(pending[0], chunks, message.chat_id):
            self.health.sent += 1
            return
        author = self._authors.get(message.reply_to or "")
        mentions = discord.AllowedMentions(
            everyone=False,
            roles=False,
            users=[discord.Object(author)] if author else False,
            replied_user=author is not None,
        )
        target = self.client.get_partial_messageable(int(message.chat_id))
        stream = self._streams.pop(message.chat_id, None)
        nonce = secrets.token_hex(8)
        for index, chunk in enumerate(chunks):
            streamed = index == 0 and stream is not None and stream.message is not None and not stream.broken
            if streamed and stream is not None and await self._finish_stream(stream, chunk, message.chat_id):
                continue
            reference = _reference(message.reply_to, message.chat_id) if index == 0 else None

            def post(chunk: str = chunk, ref: Any = reference, n: str = f"mb{nonce}{index:03d}") -> Any:
                # The nonce makes a retry after a lost answer idempotent (enforce_nonce).
                return target.send(chunk, reference=ref, allowed_mentions=mentions, nonce=n)

            await self._deliver(message.chat_id, post)
        self.health.sent += 1

    async def _answer_interaction(
        self, interaction: discord.Interaction, chunks: list[str], chat_id: str
    ) -> bool:
        """Replace the deferred "thinking" with the reply; ``False`` (post normally) if the token is dead."""
        none = discord.AllowedMentions.none()
        try:
            await self._deliver(
                chat_id, lambda: interaction.edit_original_response(content=chunks[0], allowed_mentions=none)
            )
            for chunk in chunks[1:]:

                def follow(text: str = chunk) -> Awaitable[discord.WebhookMessage | None]:
                    return interaction.followup.send(text, allowed_mentions=none, wait=True)

                await self._deliver(chat_id, follow)
        except ChannelError:
            log.warning("discord_interaction_reply_failed", channel_id=chat_id)
            return False
        return True

    async def _deliver(self, chat_id: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """Run one Discord request; retry 5xx and network failures with backoff (the library retries 429)."""
        retries = self._settings.send_retries
        for attempt in range(retries + 1):
            try:
                return await call()
            except _TRANSIENT as exc:
                if attempt == retries:
                    raise self._failed(chat_id, exc, attempt + 1) from exc
                log.warning(
                    "discord_send_retry", channel_id=chat_id, attempt=attempt + 1, error=_describe(exc)
                )
                await asyncio.sleep(min(self._settings.send_retry_delay * 2**attempt, 30.0))
            except discord.DiscordException as exc:  # refused (4xx): another try would be refused too
                raise self._failed(chat_id, exc, attempt + 1) from exc
        raise AssertionError("unreachable")

    def _failed(self, chat_id: str, exc: BaseException, attempts: int) -> ChannelError:
        self.health.send_failures += 1
        log.error("discord_send_failed", channel_id=chat_id, attempts=attempts, error=_describe(exc))
        return ChannelError(
            f"Discord request for channel {chat_id} failed after {attempts} tries: {_describe(exc)}"
        )

    # -- typing and streaming ---------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _typing(self, chat_id: str) -> AsyncIterator[None]:
        task = asyncio.create_task(self._keep_typing(chat_id), name=f"discord-typing:{chat_id}")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def activity(self, chat_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        if self._client is None:
            return contextlib.nullcontext()
        return self._typing(chat_id)

    async def _keep_typing(self, chat_id: str) -> None:
        target = self.client.get_partial_messageable(int(chat_id))
        while True:
            try:
                await target.typing()
            except (discord.DiscordException, aiohttp.ClientError, OSError) as exc:
                log.debug("discord_typing_failed", channel_id=chat_id, error=_describe(exc))
            await asyncio.sleep(_TYPING_EVERY)

    def partial_sink(self, chat_id: str) -> PartialSink | None:
        if not self._settings.streaming or self._client is None:
            return None
        stream = self._streams[chat_id] = _Stream()

        async def show(text_so_far: str) -> None:
            preview = (split_message(text_so_far, LIMIT - 2) or [""])[0]
            now = self._clock()
            if stream.broken or not preview or preview == stream.shown:
                return
            if stream.message is not None and now - stream.last_edit < self._settings.stream_edit_interval:
                return
            stream.last_edit, stream.shown = now, preview
            try:
                if stream.message is None:
                    target = self.client.get_partial_messageable(int(chat_id))
                    ref = _reference(self._last_inbound.get(chat_id), chat_id)
                    options: dict[str, Any] = {"reference": ref} if ref is not None else {}
                    stream.message = await target.send(preview + " …", **options)
                else:
                    await stream.message.edit(content=preview + " …")
            except (discord.DiscordException, aiohttp.ClientError, OSError) as exc:
                stream.broken = True  # the final reply still goes out as new messages
                log.warning("discord_stream_failed", channel_id=chat_id, error=_describe(exc))

        return show

    async def _finish_stream(self, stream: _Stream, chunk: str, chat_id: str) -> bool:
        message = stream.message
        assert message is not None
        try:
            await self._deliver(chat_id, lambda: message.edit(content=chunk))
        except ChannelError:
            return False
        return True


class _GatewayClient(discord.Client):
    """discord.py's client with its events routed to the channel."""

    def __init__(self, channel: DiscordChannel, **options: Any) -> None:
        super().__init__(**options)
        self._channel = channel

    async def on_ready(self) -> None:
        self._channel._ready.set()
        self._channel.health.state = "running"

    async def on_resumed(self) -> None:
        self._channel.health.state = "running"
        log.info("discord_resumed")

    async def on_disconnect(self) -> None:
        if self._channel.health.state == "running":
            self._channel.health.state = "degraded"

    async def on_message(self, message: discord.Message) -> None:
        await self._channel._on_message(message)

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        await self._channel._on_interaction(interaction)

    async def on_error(self, event_method: str, /, *args: Any, **kwargs: Any) -> None:
        log.exception("discord_event_failed", event=event_method)


def _point_library_at(api_base: str | None, gateway_url: str | None) -> Callable[[], None]:
    """Aim discord.py at other endpoints (tests, proxies); returns the undo.

    The library keeps both addresses as class attributes, so the undo runs in ``stop``.
    """
    old_base, old_gateway = Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    if api_base:
        Route.BASE = api_base.rstrip("/")
    if gateway_url:
        DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway_url)

    def restore() -> None:
        Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = old_base, old_gateway

    return restore


def _startup_error(gateway: asyncio.Task[None], timeout: float) -> ChannelError:
    if not gateway.done():
        return ChannelError(f"Discord did not become ready within {timeout:g} s (discord.start_timeout)")
    exc = gateway.exception() if not gateway.cancelled() else None
    if isinstance(exc, discord.PrivilegedIntentsRequired):
        return ChannelError(
            "Discord refused the message-content intent. In the Discord developer portal open your "
            "application → Bot → Privileged Gateway Intents, enable MESSAGE CONTENT INTENT, then restart."
        )
    if isinstance(exc, discord.LoginFailure):
        return ChannelError("Discord rejected the bot token: check MEMBOT_DISCORD__TOKEN / [discord] token")
    return ChannelError(f"could not connect to Discord: {_describe(exc)}")


async def _refuse(
    interaction: discord.Interaction, place: Place, pairing: PairingStore | None, user: Any
) -> None:
    if place.is_dm and pairing is not None:
        text = _pairing_text(await pairing.request(DiscordChannel.name, str(user.id), user.display_name))
    else:
        text = "Sorry, I'm not allowed to answer here."
    await interaction.response.send_message(text, ephemeral=True)


def _pairing_text(code: str | None) -> str:
    if code is None:
        return "I don't know you yet, and too many access requests are waiting. Please try again later."
    return (
        f"Hi! I don't know you yet. To get access, ask my operator to run:\n`membot pairing approve {code}`"
    )


def _reference(message_id: str | None, chat_id: str) -> discord.MessageReference | None:
    if not message_id or not message_id.isdigit():
        return None
    return discord.MessageReference(
        message_id=int(message_id), channel_id=int(chat_id), fail_if_not_exists=False
    )


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    if isinstance(exc, discord.HTTPException):
        return f"HTTP {exc.status} (code {exc.code}): {exc.text or exc}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
