"""A model answer made of one repeated fence character reaches the chat, and the chat goes on.

A local model stuck on a token can answer thousands of backticks. Split for Discord's 2,000 characters,
that was a code-fence opening too long to repeat in every part: splitting raised, every send of the
answer failed the same way, and the chat's later answers waited behind it for the send patience (an
hour). Through the real discord.py, dispatcher, pipeline and model client, against the fakes.
"""

from __future__ import annotations

from pathlib import Path

from tests.channels.discord.kit import running_bot
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.llm_server import FakeLLMServer, FakeReply


async def test_an_answer_of_repeated_backticks_is_sent_and_the_next_one_follows(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        alice = fake.user("alice")
        dm = fake.dm_channel()
        llm.script(FakeReply(text="`" * 5000), FakeReply(text="~" * 3000 + "\nstill here\n" + "~" * 3000))
        async with running_bot(fake, llm, tmp_path / "ws", {"allowed_users": [alice.id]}):
            await fake.user_message(channel_id=dm, author=alice, content="say something")
            await fake.wait_until(lambda: "".join(fake.bot_texts(dm)).count("`") == 5000, timeout=30)
            await fake.user_message(channel_id=dm, author=alice, content="and again")
            await fake.wait_until(lambda: "".join(fake.bot_texts(dm)).count("~") == 6000, timeout=30)
            await fake.user_message(channel_id=dm, author=alice, content="and a third time")
            await fake.wait_until(lambda: "echo: and a third time" in fake.bot_texts(dm), timeout=30)
        texts = fake.bot_texts(dm)
    assert all(0 < len(text) <= 2000 for text in texts)
    assert "".join(texts).count("`") == 5000  # nothing of it lost, nothing added
    assert "still here" in "".join(texts)
    assert texts[-1] == "echo: and a third time"
