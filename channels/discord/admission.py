"""Who is heard on Discord beyond the allowlists: pairing approvals, and the code offered to a stranger.

:class:`~channels.discord.inbound.DiscordAccess` says what the configuration admits; this adds the DM
users an operator approved through pairing (``membot pairing approve CODE``), and answers a stranger in
a DM with a pairing code when ``discord.pairing`` is on: a message at most once a minute
(:class:`~bot.pairing.OfferPacing`: a flood gets one offer, not one each), a slash command with an
ephemeral answer. It has state of its own (the pairing store, the offers' pacing) and the channel asks
it one thing per message or command, so it stands apart from the channel's gateway and hand-over code.

While ``pairing.json`` cannot be read (damaged, or refused because a newer membot wrote it; only the
operator can fix that), whether a DM user not in the allowlists is heard cannot be told. Their message
waits, asked about again with backoff, under its chat's lock: the chat's later messages stay behind it,
other chats go on, and it is taken in once the file is fixed (never dropped, never answered twice; a
stop cancels the wait, leaving it to the next start's catch-up). Their slash command, which Discord
wants answered within 3 s, gets an ephemeral "try again later". The operator's log names the file and
the fix once per outage (``storage_unavailable``, ``what="checking Discord pairings"``), not once per
message or try; /healthz names it while a message waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import discord
import structlog

from bot.config import DiscordSettings
from bot.errors import ChannelError, ChannelRefused
from bot.pairing import OfferPacing, PairingStore
from bot.ports import ChannelHealth
from channels.discord.inbound import DiscordAccess, Place
from channels.discord.outbound import DiscordOutbox
from channels.outage import StorageOutage, is_storage_error

log = structlog.get_logger(__name__)

CANNOT_CHECK = "Sorry, I can't check your access right now. Please try again later."
_WAITING = (
    "DMs from users admitted by pairing wait, in order, and are taken in once it can be read; their "
    "slash commands are asked to try again later; the allowlists' users and server channels go on"
)


class DiscordAdmission:
    """The allowlists plus pairing (see the module doc); ``channel`` names the pairing store's entries."""

    def __init__(
        self,
        settings: DiscordSettings,
        access: DiscordAccess,
        pairing: PairingStore | None,
        outbox: DiscordOutbox,
        clock: Callable[[], float],
        *,
        channel: str,
        health: ChannelHealth,
        retry_delay: float,
        retry_max_delay: float,
    ) -> None:
        self._settings = settings
        self._access = access
        # ``pairing = false`` stops offering codes; whom the operator approved stays approved until
        # ``membot pairing revoke`` (as on Telegram): an approval is the operator's own decision.
        self._pairing = pairing
        self._offers = OfferPacing(clock)
        self._outbox = outbox
        self.name = channel
        self._unreadable = StorageOutage(
            "checking Discord pairings",
            first_delay=retry_delay,
            max_delay=retry_max_delay,
            health=health,
            hint=_WAITING,
        )
        self._waiting: set[asyncio.Task[Any]] = set()  # messages waiting for pairing.json
        self._closed = False

    async def admitted(
        self, user_id: str, user_name: str, place: Place, message: discord.Message | None
    ) -> bool:
        """:meth:`_heard`, asked again with backoff while pairing.json cannot be read (see the module doc);
        the caller holds the chat's lock."""
        holder, tries = object(), 0
        task = asyncio.current_task()
        assert task is not None  # (a coroutine runs in a task)
        try:
            while True:
                try:
                    return await self._heard(user_id, user_name, place, message, holder)
                except Exception as exc:
                    if not is_storage_error(exc):
                        raise
                    tries += 1
                    self._unreadable.failed(exc, holder)
                self._waiting.add(task)
                if self._closed:  # one queued behind a wait the stop cancelled: left to the catch-up too
                    task.cancel()
                await self._unreadable.pause(self._unreadable.delay(tries))
        finally:
            self._waiting.discard(task)
            self._unreadable.given_up(holder)

    async def admits_command(self, interaction: discord.Interaction, place: Place) -> bool:
        """Whether a slash command is heard; one that is not gets its ephemeral answer here: a pairing
        code for a stranger in a DM (when ``pairing`` is on), a refusal, or, while pairing.json cannot
        be read, "try again later" (Discord wants an answer within 3 s: no waiting)."""
        user = interaction.user
        try:
            if await self._heard(str(user.id), user.display_name, place, None, interaction.id):
                return True
            text = await self._refusal(str(user.id), user.display_name, place)
        except Exception as exc:
            if not is_storage_error(exc):
                raise
            self._unreadable.failed(exc, interaction.id)
            self._unreadable.given_up(interaction.id)  # nothing waits for it: /healthz is not held
            text = CANNOT_CHECK
        await self._outbox.deliver(
            place.channel_id, lambda: interaction.response.send_message(text, ephemeral=True)
        )
        return False

    async def close(self) -> None:
        """Cancel the waits for pairing.json, and any that begins after (a message of the chat queued
        behind one of them): their messages are left to the next start's catch-up."""
        self._closed = True
        waiting = list(self._waiting)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    async def _heard(
        self, user_id: str, user_name: str, place: Place, message: discord.Message | None, holder: object
    ) -> bool:
        """Allowed by the allowlists or a pairing; an unknown DM user is offered a pairing code (when
        ``pairing`` is on). A pairing.json that cannot be read raises (StorageError, OSError); one read
        ends ``holder``'s wait, and the outage with the last one (a slash command's ends it too)."""
        if self._access.admits(user_id, place):
            return True
        if place.is_dm and self._pairing is not None:
            approved = await self._pairing.is_approved(self.name, user_id)
            self._unreadable.recovered(holder)
            if approved:
                return True
        if not place.is_dm or self._pairing is None or not self._settings.pairing:
            log.info("discord_message_denied", user_id=user_id, channel_id=place.channel_id)
            return False
        if message is not None and self._offers.may_offer(user_id):  # (a flood: one offer a minute)
            code = await self._pairing.request(self.name, user_id, user_name)
            try:
                await self._outbox.deliver(
                    place.channel_id, lambda: message.channel.send(_pairing_text(code))
                )
            except ChannelError as exc:  # their DMs closed (403, 50007), say. It failed the event handler;
                # now, as on Telegram, not tried again: writing a minute on gets the offer (the same code).
                reason = exc.reason if isinstance(exc, ChannelRefused) else str(exc)
                log.warning("discord_pairing_offer_not_sent", user_id=user_id, reason=reason)
        return False

    async def _refusal(self, user_id: str, user_name: str, place: Place) -> str:
        """The answer to a slash command from someone not :meth:`_heard` (a pairing code in DMs)."""
        if place.is_dm and self._pairing is not None and self._settings.pairing:
            return _pairing_text(await self._pairing.request(self.name, user_id, user_name))
        return "Sorry, I'm not allowed to answer here."


def _pairing_text(code: str | None) -> str:
    if code is None:
        return "I don't know you yet, and too many access requests are waiting. Please try again later."
    return (
        f"Hi! I don't know you yet. To get access, ask my operator to run:\n`membot pairing approve {code}`"
    )
