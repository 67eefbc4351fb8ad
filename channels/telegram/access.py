"""Who may talk to the Telegram bot where, and the pairing code offered to a stranger.

Access is deny by default (STYLE 8). In a private chat the sender must be in ``allowed_users`` or
approved by an operator through pairing (``membot pairing approve CODE``); a group or supergroup must be
in ``allowed_groups``, and then anyone in it may write. Channels and anything else are refused. A
stranger writing in private is offered a pairing code when ``telegram.pairing`` is on, at most once a
minute (:class:`~bot.pairing.OfferPacing`): a flood of messages gets one offer, not one each.

A group an admin upgrades to a supergroup gets a new chat id (Telegram's service messages carry
``migrate_to_chat_id`` in the old chat, ``migrate_from_chat_id`` in the new one). The new id is not in
``allowed_groups`` (unless it holds ``"*"``), so the bot falls silent there;
:meth:`TelegramAccess.note_migration` says so in the log, with the fix, instead of only an info line
per refused message. The group's
conversation and memory move to the new id at the next start (bot/session_moves.py): the channel
records the move when the old group was allowed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from telegram import Message
from telegram.constants import ChatType

from bot.config import TelegramSettings
from bot.errors import ChannelError
from bot.pairing import OfferPacing, PairingStore
from channels.base import Allowlist

log = structlog.get_logger(__name__)

SendPlain = Callable[[int, str], Awaitable[None]]
"""``(chat id, text)`` → sent as plain text, or :class:`~bot.errors.ChannelError` (the channel's outbox)."""


class TelegramAccess:
    """The allowlists and pairing of :class:`~bot.config.TelegramSettings` (see the module doc).

    Args:
        settings: the ``[telegram]`` settings slice.
        pairing: the shared pairing store; approvals and requests are kept under ``channel``.
        channel: the channel's name in the pairing store (``telegram``).
        send: sends a pairing offer (see :data:`SendPlain`).
        monotonic: the clock that paces offers.
    """

    def __init__(
        self,
        settings: TelegramSettings,
        pairing: PairingStore,
        *,
        channel: str,
        send: SendPlain,
        monotonic: Callable[[], float],
    ) -> None:
        self._users = Allowlist(settings.allowed_users)
        self._groups = Allowlist(settings.allowed_groups)
        self._settings = settings
        self._pairing = pairing
        self._channel = channel
        self._send = send
        self._offers = OfferPacing(monotonic)
        self._migrations: set[tuple[int, int]] = set()  # (old, new) already logged

    async def admits(self, message: Message) -> bool:
        """Whether the message's sender may talk to the bot in its chat; a stranger in a private chat is
        offered a pairing code (when allowed) and not admitted."""
        user, chat = message.from_user, message.chat
        if user is None:
            return False
        if chat.type == ChatType.PRIVATE:
            if self._users.allows(user.id) or await self._pairing.is_approved(self._channel, str(user.id)):
                return True
            await self._offer_pairing(message)
            return False
        if chat.type not in (ChatType.GROUP, ChatType.SUPERGROUP) or not self._groups.allows(chat.id):
            log.info("telegram_chat_not_allowed", chat_id=chat.id, chat_type=chat.type)
            return False
        return True

    def note_migration(self, message: Message) -> tuple[int, int] | None:
        """An allowed group's upgrade to a supergroup, as ``(old id, new id)``, once per pair (Telegram
        sends one service message in the old chat and one in the new); ``None`` for the second, or
        for a group the bot was not in. Logged, with the fix when the new id is not allowed (see the
        module doc)."""
        old = message.migrate_from_chat_id or message.chat.id
        new = message.migrate_to_chat_id or message.chat.id
        if old == new or (old, new) in self._migrations:
            return None
        self._migrations.add((old, new))
        if not self._groups.allows(old):
            return None
        moves = f"its conversation and memory move from telegram:{old} to telegram:{new} at the next start"
        if self._groups.allows(new):
            log.info("telegram_group_migrated", old_chat_id=old, new_chat_id=new, note=moves)
            return old, new
        log.warning(
            "telegram_group_migrated",
            old_chat_id=old,
            new_chat_id=new,
            reason="the group became a supergroup with a new chat id, which telegram.allowed_groups lacks",
            fix=f"add {new} to telegram.allowed_groups (and {old}'s entry in telegram.groups, if any, "
            f"as {new}), then restart: {moves}",
        )
        return old, new

    async def _offer_pairing(self, message: Message) -> None:
        user = message.from_user
        assert user is not None
        if not self._settings.pairing:
            log.info("telegram_user_not_allowed", user_id=user.id)
            return
        if not self._offers.may_offer(str(user.id)):
            return  # offered a moment ago: the same code, and a flood of them would hold up everyone
        code = await self._pairing.request(self._channel, str(user.id), user.full_name)
        log.info("telegram_pairing_requested", user_id=user.id, issued=code is not None)
        try:
            await self._send(message.chat.id, _offer_text(code))
        except ChannelError:  # logged; not tried again: writing again gets the offer (the same code)
            log.info("telegram_pairing_offer_not_sent", user_id=user.id)


def _offer_text(code: str | None) -> str:
    """The offer of ``code``, or why there is none (``None``: the channel has all pending codes it may)."""
    if code is None:
        return "I can't take more access requests right now. Please try again in an hour."
    return (
        "Hi! I don't know you yet. To get access, ask the operator of this bot to run:\n\n"
        f"membot pairing approve {code}\n\nThe code is valid for one hour."
    )
