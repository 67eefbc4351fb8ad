"""Whether a Telegram message is meant for this bot, and its text as the model should read it.

In a group the bot answers only when addressed (unless ``require_mention`` is off for the chat): an
``@mention`` of it, a ``text_mention`` of it, a reply to one of its messages, or a command, which is
``/cmd@ThisBot`` or one of the bot's own commands (``/usr/bin is broken`` is no command for us, and
``/cmd@OtherBot`` is ignored). The mention is cut out of the text; entity offsets are UTF-16 code units,
so they are converted before cutting. What a message replies to or passes on is part of what it says,
so it is put in front as a quote or a ``[forwarded from …]`` note. Everything here is a function of the
message, the bot's identity and the settings: no PTB calls, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from telegram import Message
from telegram.constants import ChatType, MessageEntityType

from bot.config import TelegramSettings
from bot.surrogates import scrub
from channels.base import quote_reply

_COMMAND = re.compile(r"^/([A-Za-z0-9_]{1,32})@([A-Za-z0-9_]+)(?=\s|$)")


@dataclass(frozen=True, slots=True)
class Addressed:
    """A message meant for this bot: the text to hand on, and whether it is a command (sent on alone)."""

    text: str
    command: bool


def addressed(
    message: Message, settings: TelegramSettings, *, username: str, bot_id: int, commands: Iterable[str]
) -> Addressed | None:
    """The message's text for the model, or ``None`` when it is not for this bot (see the module doc).

    ``username`` and ``bot_id`` are this bot's; ``commands`` are the names of the commands it offers.
    Whether the sender may talk to the bot at all is the caller's to decide first.
    """
    private = message.chat.type == ChatType.PRIVATE
    text, mentioned = _without_mention(message, username, bot_id)
    is_command = text.startswith("/")
    if is_command:
        normalized = normalize_command(text, username)
        if normalized is None:
            return None  # a command for another bot in the same group
        # In a group, "/usr/bin is broken" or "/shrug" is no command for us: only one of ours, or
        # one addressed to this bot by name, is.
        is_command = private or normalized != text or _is_ours(normalized, commands)
        text = normalized
    for_us = mentioned or is_command or _replies_to(message, bot_id)
    if not private and _requires_mention(settings, message.chat.id) and not for_us:
        return None
    if not is_command:  # what the message answers or passes on is part of what it says
        text = "\n".join(part for part in (_forwarded(message), _quoted(message, bot_id), text) if part)
    return Addressed(text, is_command)


def normalize_command(text: str, bot_username: str) -> str | None:
    """``/cmd@ThisBot args`` → ``/cmd args``; ``None`` when the command names another bot.

    ``/start`` (what a Telegram client sends when someone opens the bot) becomes ``/help``.
    """
    match = _COMMAND.match(text)
    if match is not None:
        if match.group(2).lower() != bot_username.lower():
            return None
        text = f"/{match.group(1)}{text[match.end() :]}"
    if text == "/start" or text.startswith("/start "):
        return "/help"
    return text


def remove_utf16_spans(text: str, spans: Iterable[tuple[int, int]]) -> str:
    """Cut ``(offset, length)`` spans given in UTF-16 code units out of ``text``."""
    units = text.encode("utf-16-le")
    for offset, length in sorted(spans, reverse=True):
        units = units[: offset * 2] + units[(offset + length) * 2 :]
    return re.sub(r"[ \t]{2,}", " ", units.decode("utf-16-le")).strip()


def _is_ours(text: str, commands: Iterable[str]) -> bool:
    """Whether ``text`` starts with one of the commands this bot offers (``/help``, ``/status``...)."""
    name = text[1:].split(maxsplit=1)[0].lower() if len(text) > 1 else ""
    return any(name == command.lower() for command in commands)


def _without_mention(message: Message, username: str, bot_id: int) -> tuple[str, bool]:
    """The message text with this bot's @mention / text_mention cut out, and whether it had one."""
    text = scrub(message.text or message.caption or "")  # U+FFFD is one UTF-16 unit too: offsets fit
    entities = message.entities if message.text else message.caption_entities
    spans: list[tuple[int, int]] = []
    units = text.encode("utf-16-le")
    for entity in entities:
        if entity.type == MessageEntityType.MENTION:
            word = units[entity.offset * 2 : (entity.offset + entity.length) * 2].decode("utf-16-le")
            if word.lower() == f"@{username}".lower():
                spans.append((entity.offset, entity.length))
        elif entity.type == MessageEntityType.TEXT_MENTION and entity.user and entity.user.id == bot_id:
            spans.append((entity.offset, entity.length))
    if not spans:
        return text.strip(), False
    return remove_utf16_spans(text, spans), True


def _quoted(message: Message, bot_id: int) -> str:
    """The message it replies to, quoted, unless that is the bot's own (in the history already) or
    a forum topic's first message (every message of a topic "replies" to it)."""
    replied = message.reply_to_message
    if replied is None or _replies_to(message, bot_id):
        return ""
    if message.is_topic_message and replied.message_id == message.message_thread_id:
        return ""
    who = replied.from_user.full_name if replied.from_user is not None else "someone"
    return quote_reply(who, scrub(replied.text or replied.caption or ""))


def _replies_to(message: Message, bot_id: int) -> bool:
    """Whether the message replies to one of the bot's own messages."""
    replied = message.reply_to_message
    if replied is None or replied.from_user is None or replied.from_user.id != bot_id:
        return False
    # In forum topics every message "replies" to the topic's first message; that is no reply.
    return not (message.is_topic_message and replied.message_id == message.message_thread_id)


def _requires_mention(settings: TelegramSettings, chat_id: int) -> bool:
    group = settings.groups.get(str(chat_id))
    return group.require_mention if group is not None else settings.require_mention


def _forwarded(message: Message) -> str:
    """``[forwarded from …]`` for a forwarded message (the model would take it for the user's words)."""
    origin = message.forward_origin
    if origin is None:
        return ""
    name = (
        getattr(getattr(origin, "sender_user", None), "full_name", None)
        or getattr(origin, "sender_user_name", None)
        or getattr(getattr(origin, "sender_chat", None), "title", None)
        or getattr(getattr(origin, "chat", None), "title", None)
        or "someone"
    )
    return f"[forwarded from {name}]"
