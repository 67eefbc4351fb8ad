"""Which channels the settings start, and what their settings decide elsewhere: kept out of the wiring.

A channel runs when its token (or, for the terminal, its switch) is set. Its ``admin_users`` (else the
users its ``allowed_users`` names one by one) see the operator's figures in /status, and Discord's
catch-up decides how many messages of a chat may be handed over again. The composition root
(bot/app.py) asks these questions and hands the answers to the parts it builds; ``membot doctor`` asks
the first one too.
"""

from __future__ import annotations

from bot.commands import Admins
from bot.config import Settings
from bot.intake import COMMANDS_NOTED


def configured_channels(settings: Settings) -> list[str]:
    """The channels ``membot run`` starts, in this order: those whose token (or switch) is set."""
    names = []
    if settings.telegram.token is not None:
        names.append("telegram")
    if settings.discord.token is not None:
        names.append("discord")
    if settings.terminal.enabled:
        names.append("cli")
    return names


def admins(settings: Settings) -> Admins:
    """The operators /status shows the day's spend to: ``<channel>.admin_users``, or when a channel names
    none the users its ``allowed_users`` lists one by one (the operator let them in by name, not a
    pairing: a bot for one person shows its owner the cost without more setup); and whoever is at the
    terminal (``cli``: the machine's own user, who can read usage.json anyway)."""
    users: set[tuple[str, str]] = set()
    for channel, config in (("telegram", settings.telegram), ("discord", settings.discord)):
        named = config.admin_users or [user for user in config.allowed_users if user != "*"]
        users |= {(channel, user) for user in named}
    return Admins(frozenset(users), local=frozenset({"cli"}))


def redelivery_window(settings: Settings) -> int:
    """The most messages of a chat a channel may hand over again: Discord's catch-up hands over up to
    ``discord.catch_up_max_messages`` after a mark not on disk yet; Telegram's journal takes an update
    once (bot/intake.py, ``COMMANDS_NOTED``)."""
    discord = settings.discord.catch_up_max_messages if settings.discord.token is not None else 0
    return max(COMMANDS_NOTED, discord)
