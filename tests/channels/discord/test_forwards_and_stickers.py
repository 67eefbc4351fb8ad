"""A forward or a sticker sent alone reaches the model as a line saying so, never dropped in silence.

Discord keeps a forwarded message's words in a snapshot, and a sticker is no text: the message's own
content is empty either way, and the channel took such a message for an empty one and ignored it
without a reply, a session entry or a log line. Through the real discord.py, dispatcher, pipeline and
model client, against the fakes.
"""

from __future__ import annotations

from pathlib import Path

from tests.channels.discord.test_channel import discord_world


async def test_a_forward_and_a_sticker_sent_alone_are_heard(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:
        d = w.discord
        await d.user_message(
            channel_id=w.dm, author=w.alice, content="", forwarded="The meeting moved to 3pm."
        )
        [first] = await d.wait_for_bot_messages(w.dm, timeout=30)
        await d.user_message(channel_id=w.dm, author=w.alice, content="", stickers=("thumbs up",))
        [_, second] = await d.wait_for_bot_messages(w.dm, 2, timeout=30)
        await d.user_message(channel_id=w.dm, author=w.alice, content="see this", forwarded="")
        await d.wait_for_bot_messages(w.dm, 3, timeout=30)
    assert first["content"] == "echo: [forwarded message]\nThe meeting moved to 3pm."
    assert second["content"] == "echo: [sticker thumbs up]"
    assert w.user_texts()[-1] == "see this\n\n[forwarded message]"
