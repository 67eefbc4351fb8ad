"""Which failed sends Telegram refuses for good, and what each means to the operator.

The Bot API answers a send to a chat the bot cannot reach with 403 ("Forbidden: bot was blocked by
the user", "…bot was kicked from the group chat", "…user is deactivated") or 400 ("Bad Request: chat
not found", "…not enough rights to send text messages to the chat"). Sent again, the same request gets
the same answer until someone acts, so :func:`as_channel_error` makes it a
:class:`~bot.errors.ChannelRefused`, which the dispatcher sets aside at once instead of sending it
again for an hour. Whether it is refused is decided by PTB's error type (``Forbidden``, ``BadRequest``,
``ChatMigrated``); the description only picks the words for the log. A 429 (``RetryAfter``, once
``AIORateLimiter`` gave up), a timeout, a connection failure or a 5xx (``NetworkError``) stays a plain
:class:`~bot.errors.ChannelError`: it may work later.

Parse errors and "message is too long" are 400s too, but :mod:`channels.telegram.outbound` handles
them before they get here; a 400 that still arrives would be refused the same way on every try. One
that is not about the chat (none of the known words) is about the message, and the chat can still be
told: a :class:`~bot.errors.MessageRefused`.
"""

from __future__ import annotations

from telegram.error import BadRequest, ChatMigrated, Forbidden, TelegramError

from bot.errors import ChannelError, ChannelRefused, MessageRefused

_MUTED, _UNMUTE = "the bot may not write in the chat", "a group admin has to allow the bot to send messages"

# (words in Telegram's description, what happened, how to fix it), most specific first.
_KNOWN: tuple[tuple[str, str, str], ...] = (
    ("blocked by the user", "the user blocked the bot", "only the user can unblock the bot"),
    ("kicked", "the bot was removed from the group", "add the bot to the group again"),
    ("user is deactivated", "the user deleted their Telegram account", "none: the chat is gone"),
    (
        "can't initiate conversation",
        "the user never started a chat with the bot",
        "the user has to open the bot in Telegram and press Start",
    ),
    ("not a member", "the bot is not a member of the chat", "add the bot to the chat"),
    (
        "chat not found",
        "Telegram knows no such chat (it was deleted, or the bot never was in it)",
        "check the chat id; a deleted chat cannot be reached",
    ),
    ("topic_closed", "the forum topic is closed", "a group admin can reopen the topic"),
    ("thread not found", "the forum topic was deleted", "none: the topic is gone"),
    ("rights", _MUTED, _UNMUTE),
    ("chat_write_forbidden", _MUTED, _UNMUTE),
)

# The user's own doing (blocked the bot, left Telegram, never pressed Start), nothing the operator could
# change: logged as a warning, not an error.
_BY_USER = frozenset({"blocked by the user", "user is deactivated", "can't initiate conversation"})


def refuses_for_good(exc: Exception) -> bool:
    """Whether ``exc`` says the chat refuses the bot for good: a streamed preview stops trying then."""
    return isinstance(exc, TelegramError) and isinstance(as_channel_error("", exc), ChannelRefused)


def as_channel_error(message: str, exc: TelegramError) -> ChannelError:
    """``exc`` (a failed send's final error) as the core sees it: refused for good, or maybe later."""
    if isinstance(exc, ChatMigrated):
        return ChannelRefused(
            message,
            reason=f"the group became a supergroup, with the new chat id {exc.new_chat_id}",
            fix=f"allow {exc.new_chat_id} in telegram.allowed_groups",
        )
    if not isinstance(exc, Forbidden | BadRequest):
        return ChannelError(message)
    said = str(exc).lower()
    for words, reason, fix in _KNOWN:
        if words in said:
            return ChannelRefused(message, reason=reason, fix=fix, by_user=words in _BY_USER)
    refused = MessageRefused if isinstance(exc, BadRequest) else ChannelRefused
    return refused(
        message,
        reason=f"Telegram refused the message ({exc})",
        fix="see Telegram's words in the error; the same request would be refused again",
    )
