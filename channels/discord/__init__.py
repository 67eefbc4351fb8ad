"""The Discord channel, as one package so its discord.py-specific parts stay together.

Only :class:`DiscordChannel` is meant for the composition root; the modules beside it are its parts:
``channel`` (lifecycle and the path of a message), ``inbound`` (who is heard, attachments),
``commands`` (slash commands) and ``outbound`` (replies). Inside the package ``import discord`` is
the discord.py library (imports are absolute), never this package, which is ``channels.discord``.
"""

from channels.discord.channel import DiscordChannel

__all__ = ["DiscordChannel"]
