"""An answer Discord refuses for what it says (a server's automatic moderation: HTTP 400, code 200000)
is not kept to be refused again before every later answer of the chat: the chat is told, in plain
words, and goes on. The real discord.py against the fake Discord, the real dispatcher and pipeline."""

from __future__ import annotations

from pathlib import Path

from bot.dispatcher.delivery import REJECTED_NOTICE
from tests.channels.discord.test_channel import discord_world


async def test_an_answer_automod_blocks_is_told_and_the_chat_goes_on(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:
        d = w.discord
        d.block_word("UNSENDABLE")
        await d.user_message(channel_id=w.dm, author=w.alice, content="say UNSENDABLE")
        [told] = await d.wait_for_bot_messages(w.dm)
        tries = len([r for r in d.requests if "UNSENDABLE" in str(r.body)])
        await d.user_message(channel_id=w.dm, author=w.alice, content="and then?")
        [_, then] = await d.wait_for_bot_messages(w.dm, 2)
        again = len([r for r in d.requests if "UNSENDABLE" in str(r.body)])
    assert told["content"] == REJECTED_NOTICE.format(platform="Discord")
    assert then["content"] == "echo: and then?"
    assert again == tries  # not tried again before the next answer
