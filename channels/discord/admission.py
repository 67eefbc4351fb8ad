"""Who is heard on Discord beyond the allowlists: pairing approvals, and the code offered to a stranger.

:class:`~channels.discord.inbound.DiscordAccess` says what the configuration admits; this adds the DM
users an operator approved through pairing (``membot pairing approve CODE``), and answers a stranger in
a DM with a pairing code when ``discord.pairing`` is on: a message at most once a minute
(:class:`~bot.pairing.OfferPacing`: a flood gets one offer, not one each), a slash command with an
ephemeral answer. It has state of its own (the pairing store, the offers' pacing) and the channel asks
it one thing per message or command, so it stands apart from the channel's gateway and hand-over code.
"""

from __future__ import annotations

from collections.abc import Callable

import discord
import structlog

from bot.config import DiscordSettings
from bot.pairing import OfferPacing, PairingStore
from channels.discord.inbound import DiscordAccess, Place
from channels.discord.outbound import DiscordOutbox

log = structlog.get_logger(__name__)


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
    ) -> None:
        self._settings = settings
        self._access = access
        # ``pairing = false`` stops offering codes; whom the operator approved stays approved until
        # ``membot pairing revoke`` (as on Telegram): an approval is the operator's own decision.
        self._pairing = pairing
        self._offers = OfferPacing(clock)
        self._outbox = outbox
        self.name = channel

    async def admitted(
        self, user_id: str, user_name: str, place: Place, message: discord.Message | None
    ) -> bool:
        """Allowed by the allowlists or a pairing; an unknown DM user is offered a pairing code (when
        ``pairing`` is on)."""
        if self._access.admits(user_id, place):
            return True
        if place.is_dm and self._pairing is not None and await self._pairing.is_approved(self.name, user_id):
            return True
        if not place.is_dm or self._pairing is None or not self._settings.pairing:
            log.info("discord_message_denied", user_id=user_id, channel_id=place.channel_id)
            return False
        if message is not None and self._offers.may_offer(user_id):  # (a flood: one offer a minute)
            code = await self._pairing.request(self.name, user_id, user_name)
            await self._outbox.deliver(place.channel_id, lambda: message.channel.send(_pairing_text(code)))
        return False

    async def refuse(self, interaction: discord.Interaction, place: Place) -> None:
        """Answer a slash command from someone not :meth:`admitted` (a pairing code in DMs)."""
        pairing = self._pairing if self._settings.pairing else None
        await self._outbox.deliver(place.channel_id, lambda: _refusal(interaction, place, pairing, self.name))


async def _refusal(
    interaction: discord.Interaction, place: Place, pairing: PairingStore | None, channel: str
) -> None:
    """An ephemeral answer for a slash command from someone not allowed (a pairing code in DMs)."""
    user = interaction.user
    if place.is_dm and pairing is not None:
        text = _pairing_text(await pairing.request(channel, str(user.id), user.display_name))
    else:
        text = "Sorry, I'm not allowed to answer here."
    await interaction.response.send_message(text, ephemeral=True)


def _pairing_text(code: str | None) -> str:
    if code is None:
        return "I don't know you yet, and too many access requests are waiting. Please try again later."
    return (
        f"Hi! I don't know you yet. To get access, ask my operator to run:\n`membot pairing approve {code}`"
    )
