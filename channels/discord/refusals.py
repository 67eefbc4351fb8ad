"""Which failed Discord requests are refused for good, and what each means to the operator.

Discord answers a message to a channel the bot cannot reach with 403 (50007 "Cannot send messages to
this user", 50001 "Missing Access", 50013 "Missing Permissions") or 404 (10003 "Unknown Channel"). Sent
again, the same request gets the same answer until someone acts, so :func:`as_channel_error` makes it a
:class:`~bot.errors.ChannelRefused`, which the dispatcher sets aside at once instead of sending it again
for an hour. Whether it is refused is decided by the HTTP status (400, 403 and 404: the request, not the
service); the JSON error code only picks the words for the log. A 429 (discord.py waits those out
itself; one it gave up on), a 401, a 5xx or a network failure stays a plain
:class:`~bot.errors.ChannelError`: it may work later. A 400 of no known code is about the message, not
the channel (200000: the server's automatic moderation blocked it), and the chat can still be told: a
:class:`~bot.errors.MessageRefused`.
"""

from __future__ import annotations

import discord

from bot.errors import ChannelError, ChannelRefused, MessageRefused

_REFUSED_STATUSES = frozenset({400, 403, 404})

# Discord's JSON error code -> (what happened, how to fix it).
_KNOWN: dict[int, tuple[str, str]] = {
    50007: (
        "Discord does not let the bot message this user (they turned off direct messages from server "
        "members, blocked the bot, or share no server with it any more)",
        "the user has to allow direct messages from the server's members (Privacy Settings) or unblock "
        "the bot",
    ),
    10003: ("the channel was deleted", "none: the channel is gone"),
    50001: (
        "the bot cannot see the channel (it lost View Channel there, or was removed from the server)",
        "give the bot's role View Channel in that channel, or invite the bot to the server again",
    ),
    50013: (
        "the bot lacks a permission in the channel (Send Messages, Send Messages in Threads or Read "
        "Message History)",
        "give the bot's role those permissions in that channel",
    ),
}

# Refused by the user's own settings, not by anything the operator could change: a warning, not an error.
_BY_USER = frozenset({50007})


def as_channel_error(message: str, exc: BaseException) -> ChannelError:
    """``exc`` (a request's final error) as the core sees it: refused for good, or maybe later."""
    if not isinstance(exc, discord.HTTPException) or exc.status not in _REFUSED_STATUSES:
        return ChannelError(message)
    known = _KNOWN.get(exc.code)
    if known is not None:
        return ChannelRefused(message, reason=known[0], fix=known[1], by_user=exc.code in _BY_USER)
    refused = MessageRefused if exc.status == 400 else ChannelRefused
    return refused(
        message,
        reason=f"Discord refused the request (HTTP {exc.status}, code {exc.code}: {exc.text or exc})",
        fix="see Discord's words in the error; the same request would be refused again",
    )
