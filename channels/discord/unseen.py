"""Which guild channels the bot never tracked need their history read at a fresh session.

The catch-up (:mod:`channels.discord.catch_up`) reads the chats the bot tracks after their own marks.
A channel it never tracked has no mark, yet a user may have mentioned the bot there while it was down.
Discord says, for every guild channel and active thread, the id of its newest message
(``last_message_id`` in READY's GUILD_CREATEs, which discord.py keeps on the cached channel); a
snowflake carries its time, so comparing it with the point the bot was connected until
(:attr:`~channels.discord.seen.SeenMarks.connected_until`) tells, without a request, whether anything
was written there since. Only those channels are read, and only where the bot may read the history
and someone could be heard at all (the allowlists); a quiet channel costs nothing.

What this cannot reach: a DM from a user the bot never talked with. A bot cannot list its DM channels
(READY's ``private_channels`` is empty for bots, and there is no endpoint for them), so such a DM is
lost while the bot is down; a DM chat it talks in is tracked like any other. Archived threads are not
in the cache either.

    chats = untracked_chats(client, tracked=set(since), after=seen.connected_until - MARGIN, heard=...)
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import discord

from channels.discord.inbound import Place

# Read this far before the point: a message can reach the bot a little after a later one of another
# channel (delivery is ordered per session, not by creation time), and the session's start is taken
# from the host's clock. A few channels read again cost a request each; a message skipped is lost.
MARGIN = 60_000 << 22  # 60 s in snowflake units (milliseconds shifted by 22 bits)

Untracked = discord.TextChannel | discord.VoiceChannel | discord.StageChannel | discord.Thread


def untracked_chats(
    client: discord.Client,
    *,
    tracked: Collection[str],
    after: int,
    heard: Callable[[Place], bool],
) -> list[Untracked]:
    """The cached guild channels and active threads with a message newer than ``after``, readable by
    the bot, where ``heard`` says someone could be admitted, and not in ``tracked``; oldest news first."""
    found: list[Untracked] = []
    for guild in client.guilds:
        places: list[Untracked] = [
            *guild.text_channels,
            *guild.voice_channels,
            *guild.stage_channels,
            *guild.threads,
        ]
        for chat in places:
            newest = chat.last_message_id
            if newest is None or newest <= after or str(chat.id) in tracked:
                continue
            if heard(Place.of(chat, guild.id)) and _readable(chat, guild):
                found.append(chat)
    return sorted(found, key=lambda chat: chat.last_message_id or 0)


def _readable(chat: Untracked, guild: discord.Guild) -> bool:
    """The bot may read the history here (unknown without its member: then it tries)."""
    me = guild.me
    if me is None:
        return True
    allowed = chat.permissions_for(me)
    return allowed.view_channel and allowed.read_message_history
