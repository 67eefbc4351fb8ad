"""The Discord channel: discord.py's gateway client in membot's event loop, DMs, guild channels and threads.

Each Discord channel id is a conversation (``discord:<channel_id>``; a DM, a guild channel and every
thread are separate sessions). The library keeps the gateway alive (heartbeats, RESUME after drops,
429 retries); this adapter decides who is heard (:mod:`channels.discord.inbound`, pairing in
:mod:`channels.discord.admission`), reads attachments no further than ``max_attachment_bytes``
(:mod:`channels.discord.attachments`), hands messages to the dispatcher in arrival order, answers slash
commands (:mod:`channels.discord.commands`) and delivers replies in chunks under Discord's
2000-character limit without losing one silently.

Discord never delivers a message again: a RESUME replays only events the client had not received, and
a fresh session (IDENTIFY) replays nothing, so at each one the chats the bot talks in are read for what
they missed (:mod:`channels.discord.catch_up`, from the marks of :mod:`channels.discord.seen`), and so
are the guild channels it never talked in where something was written since it was last connected
(:mod:`channels.discord.unseen`); the dispatcher takes a message that comes both ways once. A message
the dispatcher cannot store (a full disk) is submitted again with bounded exponential backoff, the
outage logged once, and the chat's later messages wait behind it; stopping the channel during the
outage leaves it to the next start's catch-up (its chat's mark never moved past it). A DM whose
admission needs a pairing.json that cannot be read waits in the same way, as long as it takes (see
:mod:`channels.discord.admission`).

    channel = DiscordChannel(settings.discord, dispatcher.submit, pairing=store,
                             commands=router.commands, vision_supported=lambda: True,
                             state_dir=settings.state_dir)
    dispatcher.attach(channel)
    await channel.start()    # returns once the gateway is READY; ChannelError if it cannot be
    ...
    await channel.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, ClassVar

import discord
import structlog

from bot.config import DiscordSettings
from bot.domain import InboundMessage, OutboundMessage
from bot.errors import ChannelError, ConfigError
from bot.pairing import PairingStore
from bot.retry import retry
from channels.base import Channel, InboundSink, PartialSink
from channels.chat_locks import ChatLocks
from channels.discord.admission import DiscordAdmission
from channels.discord.attachments import AttachmentReader
from channels.discord.catch_up import CatchUp
from channels.discord.commands import interaction_text, register_commands
from channels.discord.connect import gateway_error, point_library_at, startup_error
from channels.discord.inbound import (
    DiscordAccess,
    Place,
    addresses_bot,
    carried,
    from_a_person,
    quoted,
    readable_text,
)
from channels.discord.outbound import DiscordOutbox
from channels.discord.seen import SEEN_FILE, SeenMarks
from channels.discord.sent import SENT_FILE
from channels.outage import StorageOutage, is_storage_error

log = structlog.get_logger(__name__)


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
        storage_retry_delay: float = 0.5,
        storage_retry_max_delay: float = 30.0,
    ) -> None:
        super().__init__(submit)
        if settings.token is None:
            raise ConfigError("Discord needs a bot token: set MEMBOT_DISCORD__TOKEN or [discord] token")
        self._settings = settings
        self._token = settings.token.get_secret_value()
        self._commands = commands
        self._attachments = AttachmentReader(
            max_bytes=settings.max_attachment_bytes,
            deadline=settings.download_timeout,
            vision_supported=vision_supported,
        )
        self._state_dir = state_dir
        self._guild_ready_timeout = guild_ready_timeout
        self._access = DiscordAccess(settings)
        self._client: _GatewayClient | None = None
        self._gateway: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._restore_library: Callable[[], None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._intake = ChatLocks()  # each chat's messages reach the dispatcher in order
        self._outbox = DiscordOutbox(settings, self.health, self._live_client, clock, state_dir / SENT_FILE)
        self._admission = DiscordAdmission(
            settings,
            self._access,
            pairing,
            self._outbox,
            clock,
            channel=self.name,
            health=self.health,
            retry_delay=storage_retry_delay,
            retry_max_delay=storage_retry_max_delay,
        )
        self._outage = StorageOutage(
            "taking Discord messages in",
            first_delay=storage_retry_delay,
            max_delay=storage_retry_max_delay,
            health=self.health,
        )
        self._seen = SeenMarks(state_dir / SEEN_FILE)
        self._catch_up = CatchUp(
            settings,
            self._seen,
            self._live_client,
            lambda message: self._take_in(message, live=False),
            self._lock_of,
        )

    def _live_client(self) -> discord.Client:
        if self._client is None:
            raise ChannelError("the Discord channel is not started")
        return self._client

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        self.health.state = "starting"
        self._ready.clear()
        await self._seen.load()
        await self._outbox.open()
        await self._attachments.open()
        self._restore_library = point_library_at(self._settings.api_base, self._settings.gateway_url)
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
            error = startup_error(self._gateway, self._settings.start_timeout)
            await self.stop()
            self.health.state, self.health.error = "failed", str(error)
            raise error
        self._gateway.add_done_callback(self._gateway_ended)
        self.health.state = "running"
        if self._settings.sync_commands:
            sync = register_commands(
                self._live_client, self._commands, self._state_dir, self._settings.send_retry_delay
            )
            self._spawn(sync, "discord-commands")
        log.info("discord_started", user=str(self._client.user))

    async def stop(self) -> None:
        # The catch-up first, whole: a DM of it waiting for pairing.json, cancelled alone by the
        # admission, ended the catch-up with its other chats' reads and hand-overs running on.
        await self._catch_up.close()
        await self._admission.close()  # messages waiting for pairing.json: left to the next catch-up
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        client, self._client = self._client, None  # later sends fail as ChannelError, not in aiohttp
        if client is not None:
            await client.close()
        if self._gateway is not None:
            await asyncio.gather(self._gateway, return_exceptions=True)
        if self._restore_library is not None:
            self._restore_library()
            self._restore_library = None
        await self._outbox.close()
        await self._attachments.close()
        await self._seen.close()
        self.health.state = "stopped"

    def _gateway_ended(self, task: asyncio.Task[None]) -> None:
        # Not ``client.is_closed()``: discord.py closes the client itself before it raises a close code
        # it gives up on (4004, a token reset while serving), and that is no stop of ours.
        if task.cancelled() or self._client is None:  # ``stop`` lets go of the client first
            return
        error = gateway_error(task.exception())
        self.health.state, self.health.error = "failed", f"Discord gateway stopped: {error}"
        log.error("discord_gateway_stopped", error=str(error))

    def _spawn(self, work: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(work)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- inbound ----------------------------------------------------------------------------------

    async def _on_message(self, message: discord.Message) -> None:
        self._seen.heard(message.id)  # any message, even one not for the bot: the gateway was live
        bot = self._live_client().user
        if bot is None or not from_a_person(message, bot.id):
            return
        chat_id = str(message.channel.id)
        while (gate := self._catch_up.gate(chat_id)) is not None:  # what the chat missed goes first
            await gate.wait()
        # FIFO lock taken before any other await: messages of one chat reach the dispatcher in order.
        async with self._lock_of(chat_id):
            handed = await self._take_in(message)
            self._seen.saw(chat_id, message.id, start=handed)

    async def _take_in(self, message: discord.Message, *, live: bool = True) -> bool:
        """The path of a message, live or caught up, under its chat's lock: the access checks and mention
        rules, then the hand-over. True when the dispatcher took it (it is in the inbox on disk then).
        Only a live DM from a stranger is offered a pairing code: one caught up would get it late."""
        bot = self._live_client().user
        if bot is None or not from_a_person(message, bot.id):
            return False
        chat_id = str(message.channel.id)
        guild_id = message.guild.id if message.guild else getattr(message.channel, "guild_id", None)
        place = Place.of(message.channel, guild_id)
        user_id = str(message.author.id)
        # Gate on the mention first: chatter not meant for the bot is ignored without a trace.
        if self._access.requires_mention(place) and not addresses_bot(message, bot.id):
            return False
        offer_to = message if live else None  # (see the doc)
        if not await self._admission.admitted(user_id, message.author.display_name, place, offer_to):
            return False
        text = "\n".join(part for part in (quoted(message, bot.id), readable_text(message, bot.id)) if part)
        found = await self._attachments.read(message)
        text = "\n\n".join(part for part in (text, *carried(message), *found.notes) if part)
        if not text and not found.attachments:
            return False
        self._outbox.received(chat_id, str(message.id), message.author.id)
        await self._hand_over(
            InboundMessage(
                channel=self.name,
                chat_id=chat_id,
                sender_id=user_id,
                text=text,
                sender_name=message.author.display_name,
                message_id=str(message.id),
                timestamp=message.created_at,
                platform_date=True,
                attachments=found.attachments,
                is_group=not place.is_dm,
            )
        )
        return True

    def _lock_of(self, chat_id: str) -> AbstractAsyncContextManager[None]:
        return self._intake.hold(chat_id)

    async def _on_interaction(self, interaction: discord.Interaction) -> None:
        self._seen.heard(interaction.id)
        text = interaction_text(interaction)
        if text is None or interaction.channel_id is None:
            return
        user = interaction.user
        channel: Any = interaction.channel or discord.Object(interaction.channel_id)
        place = Place.of(channel, interaction.guild_id)
        key = f"interaction:{interaction.id}"
        # Discord drops an interaction not answered within 3 s, and the chat's lock can be held for a
        # minute (an earlier message's attachments downloading, a catch-up): the answer goes out at once,
        # while the command takes its place in the chat's queue (no await in between).
        acknowledged = asyncio.ensure_future(self._acknowledge(interaction, place, key))
        async with self._lock_of(place.channel_id):
            if not await acknowledged:
                return
            await self._hand_over(
                InboundMessage(
                    channel=self.name,
                    chat_id=place.channel_id,
                    sender_id=str(user.id),
                    text=text,
                    sender_name=user.display_name,
                    message_id=key,
                    timestamp=interaction.created_at,
                    platform_date=True,
                    is_group=not place.is_dm,
                )
            )

    async def _acknowledge(self, interaction: discord.Interaction, place: Place, key: str) -> bool:
        """Answer a slash command within Discord's 3 s: "thinking" (replaced by the reply later), or an
        ephemeral answer for one not admitted (or not checkable now). True when it is to be handed over."""
        if not await self._admission.admits_command(interaction, place):
            return False
        try:
            await self._outbox.deliver(place.channel_id, lambda: interaction.response.defer(thinking=True))
            self._outbox.awaiting_answer(key, interaction)
        except ChannelError as exc:
            # Its answer lost, a try Discord took: the retry is refused as "already acknowledged"
            # (40060), yet the "thinking" is up and only an edit of it ends it.
            if _already_acknowledged(exc):
                self._outbox.awaiting_answer(key, interaction)
            # else logged; the reply is then posted in the channel instead
        return True

    async def _hand_over(self, message: InboundMessage) -> None:
        """Submit, again and again while storage fails (see the module doc); called under the chat's lock.
        Chats hand over side by side: each call holds the outage on its own (``holder``), so one chat's
        success does not clear /healthz while another's write is refused, and one given up (a bug, the
        channel stopped) holds it no longer."""
        holder = object()
        try:
            await retry(
                lambda: self.handle_inbound(message),
                # else on_error logs it: a bug, or the channel stopped during the outage
                retry_if=lambda exc, tries: is_storage_error(exc) and self._client is not None,
                wait=lambda exc, tries: self._outage.delay(tries),
                on_retry=lambda exc, tries, delay: self._outage.failed(exc, holder),
                sleep=self._outage.pause,
            )
            self._outage.recovered(holder)
        finally:
            self._outage.given_up(holder)

    # -- outbound ---------------------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> None:
        await self._outbox.send(message)

    def activity(self, chat_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        if self._client is None:
            return contextlib.nullcontext()
        return self._outbox.typing(chat_id)

    def partial_sink(self, chat_id: str, reply_to: str | None = None) -> PartialSink | None:
        return self._outbox.partial_sink(chat_id, reply_to) if self._client is not None else None


def _already_acknowledged(exc: ChannelError) -> bool:
    cause = exc.__cause__
    return isinstance(cause, discord.HTTPException) and cause.code == ALREADY_ACKNOWLEDGED


ALREADY_ACKNOWLEDGED = 40060  # Discord's code for a second response to one interaction


class _GatewayClient(discord.Client):
    """discord.py's client with its events routed to the channel."""

    def __init__(self, channel: DiscordChannel, **options: Any) -> None:
        super().__init__(**options)
        self._channel = channel

    async def on_connect(self) -> None:
        """READY after IDENTIFY (a RESUME is ``on_resumed``): Discord replayed nothing, so catch up."""
        self._channel._catch_up.session_started()

    async def on_ready(self) -> None:
        self._channel._catch_up.session_ready()
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
        log.exception("discord_event_failed", handler=event_method)  # ("event" is the line's name)
