"""End to end: a mention in a guild channel the bot never saw, written while it was down, is answered.

The bot tracks only the chats it talked in, so such a channel has no mark to read after. Discord lists
every guild channel with its newest message id at READY; the channel reads the channels whose newest
message is younger than the point it was last connected until (channels/discord/unseen.py) and no other.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from channels.discord.seen import SEEN_FILE
from tests.channels.discord.test_catch_up import events, offline
from tests.fakes.discord_server import VIEW_CHANNEL, FakeDiscord, snowflake


def history_reads(fake: FakeDiscord, channel_id: str) -> int:
    return sum(r.method == "GET" and r.path == f"/channels/{channel_id}/messages" for r in fake.requests)


async def test_a_mention_in_a_channel_never_seen_written_while_the_bot_was_down_is_answered_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with offline(tmp_path) as o:
        news = o.discord.add_channel(o.guild, "news")
        async with o.run():
            await o.dm_from_alice("hello")
            await o.discord.wait_for_bot_messages(o.dm, 1)
        away = await o.mention(news, o.guild, o.alice, "did you see this?")  # only the history has it
        async with o.run():
            await o.discord.wait_for_bot_messages(news, 1)
            await o.mention(news, o.guild, o.alice, "and now, live")  # after what was missed, in order
            await o.discord.wait_for_bot_messages(news, 2)
        async with o.run():  # tracked now: read after its mark, nothing answered twice
            await o.mention(news, o.guild, o.alice, "third start")
            await o.discord.wait_for_bot_messages(news, 3)
        assert o.discord.bot_texts(news) == [
            "echo: alice: did you see this?",
            "echo: alice: and now, live",
            "echo: alice: third start",
        ]
        assert str(o.discord.bot_messages[1]["message_reference"]["message_id"]) == away["id"]
        assert len(o.llm.requests) == 4  # hello, and the three in news
        marks = json.loads((o.workspace / "state" / SEEN_FILE).read_text())
        assert news in marks["newest"]
    untracked = [e for e in events(caplog, "discord_caught_up") if e["tracked"] is False]
    assert [(e["chat_id"], e["handed_over"]) for e in untracked] == [(news, 1)]


async def test_only_untracked_channels_with_news_where_someone_is_heard_and_the_bot_may_read_are_read(
    tmp_path: Path,
) -> None:
    now = datetime.now(UTC)
    async with offline(tmp_path) as o:
        d, home = o.discord, o.guild
        quiet = d.add_channel(home, "quiet")
        ideas = d.add_thread(home, quiet, "ideas")  # an active thread of the quiet channel
        elsewhere = next(g for g in d.guilds.values() if g.name == "elsewhere")  # nobody is heard there
        hidden = d.add_guild("hidden")
        hidden.bot_permissions = VIEW_CHANNEL  # the bot sees the channel but may not read its history
        locked = d.add_channel(hidden, "locked")
        settings = {"allowed_users": [], "allowed_channels": [locked]}  # home is heard as an allowed guild
        await d.user_message(
            channel_id=quiet, author=o.bob, content="old chatter", guild=home, at=now - timedelta(hours=2)
        )
        async with o.run(**settings):
            await o.mention(o.general, home, o.bob, "hello")
            await d.wait_for_bot_messages(o.general, 1)
        await o.mention(ideas, home, o.bob, "a thought while you were away")
        await o.mention(o.lobby, elsewhere, o.bob, "not heard here")
        await o.mention(locked, hidden, o.bob, "history not readable")
        async with o.run(**settings):
            await d.wait_for_bot_messages(ideas, 1)
            await o.mention(o.general, home, o.bob, "live")
            await d.wait_for_bot_messages(o.general, 2)
        assert d.bot_texts(ideas) == ["echo: bob: a thought while you were away"]
        assert history_reads(d, ideas) == 1
        assert history_reads(d, quiet) == 0  # its newest message is older than the point
        assert history_reads(d, o.lobby) == 0 and history_reads(d, locked) == 0
        assert d.bot_texts(o.lobby) == [] and d.bot_texts(locked) == []


async def test_the_first_start_reads_nothing_untracked_and_the_next_only_what_came_after_it(
    tmp_path: Path,
) -> None:
    now = datetime.now(UTC)
    async with offline(tmp_path) as o:
        news = o.discord.add_channel(o.guild, "news")
        before = "before the bot ever ran"
        await o.discord.user_message(
            channel_id=news,
            author=o.alice,
            content=f"{o.discord.bot.mention} {before}",
            guild=o.guild,
            mentions=(o.discord.bot,),
            at=now - timedelta(hours=1),
        )
        async with o.run():  # no point yet: the bot knows nothing of when it was last connected
            await o.dm_from_alice("hello")
            await o.discord.wait_for_bot_messages(o.dm, 1)
            assert history_reads(o.discord, news) == 0
        await o.mention(news, o.guild, o.alice, "while you were away")
        async with o.run():
            await o.discord.wait_for_bot_messages(news, 1)
            await o.mention(news, o.guild, o.alice, "live")
            await o.discord.wait_for_bot_messages(news, 2)
        assert o.discord.bot_texts(news) == ["echo: alice: while you were away", "echo: alice: live"]
        assert all(before not in json.dumps(r.body) for r in o.llm.requests)


async def test_an_untracked_channel_that_could_not_be_read_is_read_at_the_next_start(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    async with offline(tmp_path) as o:
        d, news = o.discord, o.discord.add_channel(o.guild, "news")
        async with o.run():
            await o.dm_from_alice("hello")
            await d.wait_for_bot_messages(o.dm, 1)
        marks_file = o.workspace / "state" / SEEN_FILE
        marks = json.loads(marks_file.read_text())
        marks["connected_until"] = snowflake(now - timedelta(minutes=10))  # the bot went down then
        marks_file.write_text(json.dumps(marks))
        away = f"{d.bot.mention} while you were away"
        await d.user_message(
            channel_id=news,
            author=o.alice,
            content=away,
            guild=o.guild,
            mentions=(d.bot,),
            at=now - timedelta(minutes=5),
        )
        d.fail("GET", f"/channels/{news}/messages")  # one 503: not read at this start
        async with o.run():
            await d.wait_until(lambda: history_reads(d, news) == 1)
            await o.dm_from_alice("live")
            await d.wait_for_bot_messages(o.dm, 2)
        assert d.bot_texts(news) == []
        assert json.loads(marks_file.read_text())["connected_until"] == marks["connected_until"]  # kept
        async with o.run():
            await d.wait_for_bot_messages(news, 1)
        assert d.bot_texts(news) == ["echo: alice: while you were away"]
