"""The paste joiner keeps nothing for a chat once its messages are handed on."""

from __future__ import annotations

import asyncio

from bot.domain import InboundMessage
from channels.telegram.inbound import PasteJoiner


async def test_chats_seen_once_leave_no_lock_behind() -> None:
    """One lock per chat ever seen grew for as long as the bot ran (a public bot meets many chats)."""
    taken: list[str] = []

    async def submit(message: InboundMessage) -> None:
        taken.append(message.chat_id)

    joiner = PasteJoiner(submit, 0, max_chars=16000)
    done = [
        joiner.add(InboundMessage("telegram", str(chat), str(chat), f"hello {chat}", message_id=str(chat)))
        for chat in range(200)
    ]
    await asyncio.gather(*done)
    await joiner.close()
    assert sorted(taken, key=int) == [str(chat) for chat in range(200)]
    assert len(joiner._chats) == 0  # (a dict of 200 locks before)
