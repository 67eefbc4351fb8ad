"""Who may talk to the Discord bot where, and how a Discord message becomes an InboundMessage.

Access is deny by default (STYLE 8). A message is admitted when its author is in ``allowed_users``
(anywhere), or it was written in an allowed guild or an allowed channel (a thread counts as its parent
channel too), or it is a DM from a user an operator approved through pairing. In a guild the bot then
answers only when mentioned or replied to, unless ``mention_overrides`` says otherwise for the thread,
channel or guild (first match wins, in that order).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import discord

from bot.config import DiscordSettings
from channels.base import Allowlist, quote_reply

_USER_MENTION = re.compile(r"<@!?(\d+)>")
_ROLE_MENTION = re.compile(r"<@&(\d+)>")
_CHANNEL_MENTION = re.compile(r"<#(\d+)>")


@dataclass(frozen=True, slots=True)
class Place:
    """Where a message was written: a DM (no guild), a guild channel, or a thread and its parent."""

    channel_id: str
    guild_id: str | None = None
    parent_id: str | None = None

    @property
    def is_dm(self) -> bool:
        return self.guild_id is None

    @classmethod
    def of(cls, channel: object, guild_id: int | None) -> Place:
        parent = getattr(channel, "parent_id", None)
        return cls(
            channel_id=str(getattr(channel, "id", "")),
            guild_id=str(guild_id) if guild_id is not None else None,
            parent_id=str(parent) if parent is not None else None,
        )


class DiscordAccess:
    """The allowlists and mention rules of :class:`~bot.config.DiscordSettings` (see the module doc)."""

    def __init__(self, settings: DiscordSettings) -> None:
        self._users = Allowlist(settings.allowed_users)
        self._users_listed = bool(settings.allowed_users)  # a listed user is heard in every channel
        self._guilds = Allowlist(settings.allowed_guilds)
        self._channels = Allowlist(settings.allowed_channels)
        self._require_mention = settings.require_mention
        self._overrides = {str(k): v for k, v in settings.mention_overrides.items()}

    def admits(self, user_id: str, place: Place) -> bool:
        """Allowed by configuration (pairing approvals are checked by the caller, for DMs only)."""
        if self._users.allows(user_id):
            return True
        if place.is_dm:
            return False
        return (
            self._guilds.allows(place.guild_id)
            or self._channels.allows(place.channel_id)
            or (place.parent_id is not None and self._channels.allows(place.parent_id))
        )

    def may_hear(self, place: Place) -> bool:
        """Whether anyone could be admitted in ``place``: a listed user anywhere, anyone where the place
        (its server, channel or parent) is listed. (The catch-up reads no channel where nobody is.)"""
        return self._users_listed or self.admits("", place)

    def requires_mention(self, place: Place) -> bool:
        if place.is_dm:
            return False
        for key in (place.channel_id, place.parent_id, place.guild_id):
            if key is not None and key in self._overrides:
                return self._overrides[key]
        return self._require_mention


def from_a_person(message: discord.Message, bot_id: int) -> bool:
    """A user's plain message or reply: not the bot's own, not another bot's, not a join or pin notice,
    and not a webhook's (an integration, a bridge, a post of another server's channel the server
    follows): its author is the webhook, whose ``bot`` flag Discord does not promise, so it is told
    by ``webhook_id``, as Discord's documentation says."""
    if message.author.bot or message.author.id == bot_id or message.webhook_id is not None:
        return False
    return message.type in (discord.MessageType.default, discord.MessageType.reply)


def addresses_bot(message: discord.Message, bot_id: int) -> bool:
    """Mentioned by id or through its own role (a client's "@membot" often is the bot's managed
    integration role, ``<@&role>``), or a reply to one of the bot's messages."""
    if any(user.id == bot_id for user in message.mentions) or _mentions_id(message.content, bot_id):
        return True
    own_role = _own_role(message)
    if own_role is not None and any(role.id == own_role for role in message.role_mentions):
        return True
    reference = message.reference
    resolved = reference.resolved if reference is not None else None
    return isinstance(resolved, discord.Message) and resolved.author.id == bot_id


def _own_role(message: discord.Message) -> int | None:
    """The id of the bot's managed role in the message's guild, if it has one."""
    role = message.guild.self_role if message.guild is not None else None
    return role.id if role is not None else None


def _mentions_id(content: str, user_id: int) -> bool:
    return any(int(found) == user_id for found in _USER_MENTION.findall(content))


def readable_text(message: discord.Message, bot_id: int) -> str:
    """The text the model sees: the bot's own mention removed, other mentions as ``@name``/``#name``."""
    users = {user.id: user.display_name for user in message.mentions}
    roles = {role.id: role.name for role in message.role_mentions}
    guild = message.guild

    def user(match: re.Match[str]) -> str:
        uid = int(match.group(1))
        if uid == bot_id:
            return ""
        return f"@{users.get(uid, 'user')}"

    own_role = _own_role(message)

    def role(match: re.Match[str]) -> str:
        if int(match.group(1)) == own_role:  # the bot addressed through its role: like its mention
            return ""
        return f"@{roles.get(int(match.group(1)), 'role')}"

    def channel(match: re.Match[str]) -> str:
        found = guild.get_channel_or_thread(int(match.group(1))) if guild is not None else None
        return f"#{found.name}" if found is not None else "#channel"

    text = _USER_MENTION.sub(user, message.content)
    text = _ROLE_MENTION.sub(role, text)
    text = _CHANNEL_MENTION.sub(channel, text)
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def quoted(message: discord.Message, bot_id: int) -> str:
    """The message ``message`` replies to, quoted for the model, unless it is the bot's own (the
    history holds it) or gone: "is this true?" means nothing without it."""
    replied = message.reference.resolved if message.reference is not None else None
    if not isinstance(replied, discord.Message) or replied.author.id == bot_id:
        return ""
    return quote_reply(replied.author.display_name, readable_text(replied, bot_id))


def carried(message: discord.Message) -> list[str]:
    """What a message holds besides its own text, as lines for the model: a forwarded message (Discord
    keeps its words in a snapshot; the forward itself has no content) and stickers. Without them a
    forward or a sticker sent alone looked like an empty message and was dropped without a word."""
    lines = []
    for snapshot in message.message_snapshots:
        files = f" (with {len(snapshot.attachments)} attachment(s), not read)" if snapshot.attachments else ""
        lines.append(f"[forwarded message{files}]\n{snapshot.content}".strip())
    lines += [f"[sticker {sticker.name}]" for sticker in message.stickers]
    return lines
