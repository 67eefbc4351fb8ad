"""What a Telegram message says to the bot: steps 1-3 of the path in channels/telegram/channel.py's doc.

Only new messages count: edits, channel posts (also as Telegram copies them into the channel's
discussion group) and messages from bots are ignored, but for an admin posting anonymously as the group
(named by their signature, else :data:`ANONYMOUS_ADMIN`). A group's upgrade to a supergroup is noted
(:meth:`~channels.telegram.access.TelegramAccess.note_migration`) and, when the old group was allowed,
its session's move recorded (bot/session_moves.py). Then access (:mod:`channels.telegram.access`),
addressing (:mod:`channels.telegram.addressing`) and media (:mod:`channels.telegram.media`) decide
what, if anything, is handed on to the paste joiner (step 4).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from telegram import Bot, Message
from telegram.constants import ChatType

from bot.config import TelegramSettings
from bot.domain import InboundMessage, session_id
from bot.session_moves import record_move
from channels.telegram.access import TelegramAccess
from channels.telegram.addressing import addressed
from channels.telegram.media import Download, extract_media

ANONYMOUS_ADMIN = "Anonymous admin"  # the name of an admin who posts as the group and signs nothing

HandOn = Callable[[InboundMessage, bool], asyncio.Future[None]]
"""``(message, alone)`` → queued for the dispatcher (the channel's paste joiner); ``alone``: a command."""


class TelegramIntake:
    """Turns a Telegram message into the :class:`~bot.domain.InboundMessage` handed on, or nothing.

    Args:
        settings: the ``[telegram]`` settings slice.
        access: who may talk to the bot where.
        channel: the channel's name, for session ids.
        state_dir: where a group's move to a supergroup is recorded.
        commands: the command names ``/cmd@ThisBot`` may carry.
        bot: the running bot (its username and id tell whether a message is meant for it).
        vision_supported: asked per photo, so a model switch takes effect at once.
        download: fetches a file by id, never past a size limit.
        hand_on: where what the message says goes.
    """

    def __init__(
        self,
        settings: TelegramSettings,
        access: TelegramAccess,
        *,
        channel: str,
        state_dir: Path,
        commands: tuple[str, ...],
        bot: Callable[[], Bot],
        vision_supported: Callable[[], bool],
        download: Download,
        hand_on: HandOn,
    ) -> None:
        self._settings = settings
        self._access = access
        self._channel = channel
        self._state_dir = state_dir
        self._command_names = commands
        self._bot = bot
        self._vision = vision_supported
        self._download = download
        self._hand_on = hand_on

    async def __call__(self, message: Message) -> asyncio.Future[None] | None:
        """The future completes once the dispatcher queued the message (``None``: nothing to queue)."""
        user, chat = message.from_user, message.chat
        if message.migrate_to_chat_id or message.migrate_from_chat_id:  # a group became a supergroup
            if (moved := self._access.note_migration(message)) is not None:
                # Before the update is released: a kill meanwhile takes it in again at the next start.
                old, new = (session_id(self._channel, str(chat)) for chat in moved)
                await record_move(self._state_dir, old, new)
            return None
        # An admin posting "as the group" comes from a bot account (GroupAnonymousBot) with the group as
        # its sender_chat: one of the group's own, who speaks for it. Any other bot is not answered.
        anonymous = message.sender_chat is not None and message.sender_chat.id == chat.id
        if user is None or (user.is_bot and not anonymous):
            return None
        if message.is_automatic_forward:  # a channel post Telegram copied into its discussion group
            return None
        if not await self._access.admits(message):
            return None
        me = self._bot()
        meant = addressed(
            message, self._settings, username=me.username, bot_id=me.id, commands=self._command_names
        )
        if meant is None:
            return None
        media = await extract_media(
            message,
            download=self._download,
            vision=self._vision(),
            max_document_bytes=self._settings.max_document_bytes,
        )
        text = "\n\n".join(part for part in (meant.text, *media.notes) if part)
        if not text and not media.attachments:
            return None
        thread = message.message_thread_id if message.is_topic_message else None
        inbound = InboundMessage(
            channel=self._channel,
            chat_id=f"{chat.id}:{thread}" if thread else str(chat.id),
            sender_id=str(chat.id) if anonymous else str(user.id),
            sender_name=(message.author_signature or ANONYMOUS_ADMIN) if anonymous else user.full_name,
            text=text,
            message_id=str(message.message_id),
            timestamp=message.date,
            platform_date=True,
            attachments=tuple(media.attachments),
            is_group=chat.type != ChatType.PRIVATE,
        )
        return self._hand_on(inbound, meant.command)
