"""End to end: what users wrote while the bot was away is answered at the next fresh gateway session.

Discord keeps nothing for a bot that is down, and a session that starts with IDENTIFY replays nothing,
so the Discord channel reads the history of each chat it talks in after the newest message it saw there
(channels/discord/catch_up.py). The fake Discord behaves the same way: a message written while no
gateway is connected reaches the bot only through ``GET /channels/{id}/messages``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from channels.discord.seen import SEEN_FILE
from tests.channels.discord.kit import running_bot
from tests.fakes.discord_server import MISSING_ACCESS, FakeDiscord, FakeUser, Guild
from tests.fakes.llm_server import FakeLLMServer


@dataclass
class Offline:
    """The fake services, which outlive the bot's runs, and the bot's workspace."""

    discord: FakeDiscord
    llm: FakeLLMServer
    workspace: Path
    alice: FakeUser  # allowed everywhere
    bob: FakeUser  # allowed nowhere
    dm: str  # alice's DM with the bot
    guild: Guild  # allowed
    general: str
    lobby: str  # a channel of a guild that is not allowed: only alice is heard there
    section: dict[str, Any]

    def run(self, **settings: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        return running_bot(self.discord, self.llm, self.workspace, {**self.section, **settings})

    async def dm_from_alice(self, content: str, **kwargs: Any) -> dict[str, Any]:
        return await self.discord.user_message(
            channel_id=self.dm, author=self.alice, content=content, **kwargs
        )

    async def mention(self, channel: str, guild: Guild, author: FakeUser, content: str) -> dict[str, Any]:
        bot = self.discord.bot
        return await self.discord.user_message(
            channel_id=channel,
            author=author,
            content=f"{bot.mention} {content}",
            guild=guild,
            mentions=(bot,),
        )


@contextlib.asynccontextmanager
async def offline(tmp_path: Path) -> AsyncIterator[Offline]:
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        guild, elsewhere = fake.add_guild("home"), fake.add_guild("elsewhere")
        alice = fake.user("alice")
        section = {"allowed_users": [alice.id], "allowed_guilds": [guild.id], "sync_commands": False}
        yield Offline(
            fake, llm, tmp_path / "ws", alice, fake.user("bob"), fake.dm_channel(), guild,
            fake.add_channel(guild, "general"), fake.add_channel(elsewhere, "lobby"), section,
        )  # fmt: skip


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == name]


async def test_a_dm_sent_while_the_bot_was_down_is_answered_once_after_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with offline(tmp_path) as o:
        async with o.run():
            await o.dm_from_alice("hello")
            await o.discord.wait_for_bot_messages(o.dm, 1)
        away = await o.dm_from_alice("are you there?")  # the bot is down: only the history has it
        async with o.run():
            await o.discord.wait_for_bot_messages(o.dm, 2)
            await o.dm_from_alice("and now, live")  # answered after what was missed, in order
            await o.discord.wait_for_bot_messages(o.dm, 3)
        assert o.discord.bot_texts(o.dm) == ["echo: hello", "echo: are you there?", "echo: and now, live"]
        assert len(o.discord.identifies) == 2 and len(o.llm.requests) == 3
        reply = o.discord.bot_messages[1]
        assert str(reply["message_reference"]["message_id"]) == away["id"]  # it answers the missed message
    [caught_up] = events(caplog, "discord_caught_up")
    assert caught_up["chat_id"] == o.dm and caught_up["handed_over"] == 1 and caught_up["too_old"] == 0


async def test_a_message_taken_before_the_stop_is_not_answered_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with offline(tmp_path) as o:
        async with o.run():
            first = await o.dm_from_alice("first")
            await o.discord.wait_for_bot_messages(o.dm, 1)
            taken = await o.dm_from_alice("taken")
            await o.discord.wait_for_bot_messages(o.dm, 2)
        # As if the bot was killed after taking "taken" in but before its mark was written: the catch-up
        # reads it again, and the dispatcher knows its id.
        marks = o.workspace / "state" / SEEN_FILE
        assert json.loads(marks.read_text())["newest"][o.dm] == taken["id"]
        marks.write_text(json.dumps({"newest": {o.dm: first["id"]}}))
        await o.dm_from_alice("new while away")
        async with o.run():
            await o.discord.wait_for_bot_messages(o.dm, 3)
            await o.dm_from_alice("live")
            await o.discord.wait_for_bot_messages(o.dm, 4)
        assert o.discord.bot_texts(o.dm) == [
            "echo: first",
            "echo: taken",
            "echo: new while away",
            "echo: live",
        ]
        assert len(o.llm.requests) == 4
    assert [e["message_id"] for e in events(caplog, "duplicate_message_ignored")] == [taken["id"]]


async def test_messages_older_than_the_max_age_are_skipped_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = datetime.now(UTC)
    async with offline(tmp_path) as o:
        async with o.run():
            await o.dm_from_alice("hello", at=now - timedelta(days=3))  # the bot's last sight of the chat
            await o.discord.wait_for_bot_messages(o.dm, 1)
        for hours in (50, 49, 48):
            await o.dm_from_alice(f"{hours} hours ago", at=now - timedelta(hours=hours))
        await o.dm_from_alice("an hour ago", at=now - timedelta(hours=1))
        async with o.run():
            await o.discord.wait_for_bot_messages(o.dm, 2)
            await o.dm_from_alice("live")
            await o.discord.wait_for_bot_messages(o.dm, 3)
        assert o.discord.bot_texts(o.dm) == ["echo: hello", "echo: an hour ago", "echo: live"]
    [skipped] = events(caplog, "discord_catch_up_too_old")
    assert skipped["chat_id"] == o.dm and skipped["skipped"] == 3 and skipped["at_least"] is False
    assert skipped["max_age"] == 86400.0


async def test_after_a_long_absence_the_last_day_is_still_read_within_the_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = datetime.now(UTC)
    async with offline(tmp_path) as o:
        async with o.run(catch_up_max_messages=2):
            await o.dm_from_alice("hello", at=now - timedelta(days=5))
            await o.discord.wait_for_bot_messages(o.dm, 1)
        for days in (4, 3, 2):  # more too-old messages than the limit reads
            await o.dm_from_alice(f"{days} days ago", at=now - timedelta(days=days))
        await o.dm_from_alice("this morning", at=now - timedelta(hours=3))
        async with o.run(catch_up_max_messages=2):
            await o.discord.wait_for_bot_messages(o.dm, 2)
            await o.dm_from_alice("live")
            await o.discord.wait_for_bot_messages(o.dm, 3)
        assert o.discord.bot_texts(o.dm) == ["echo: hello", "echo: this morning", "echo: live"]
    [skipped] = events(caplog, "discord_catch_up_too_old")
    assert skipped["skipped"] == 3 and skipped["at_least"] is True  # the read stopped at limit + 1


async def test_the_catch_up_keeps_the_access_and_mention_rules(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with offline(tmp_path) as o:
        elsewhere = next(g for g in o.discord.guilds.values() if g.name == "elsewhere")
        async with o.run():
            await o.mention(o.lobby, elsewhere, o.alice, "hi")  # alice is heard anywhere
            await o.discord.wait_for_bot_messages(o.lobby, 1)
        await o.mention(o.lobby, elsewhere, o.bob, "answer me too")  # bob is not allowed here
        await o.discord.user_message(
            channel_id=o.lobby, author=o.alice, content="no mention: not for the bot", guild=elsewhere
        )
        await o.mention(o.lobby, elsewhere, o.alice, "still there?")
        async with o.run():
            await o.discord.wait_for_bot_messages(o.lobby, 2)
            await o.mention(o.lobby, elsewhere, o.alice, "live")
            await o.discord.wait_for_bot_messages(o.lobby, 3)
        assert o.discord.bot_texts(o.lobby) == [
            "echo: alice: hi",
            "echo: alice: still there?",
            "echo: alice: live",
        ]
        assert all(o.bob.id not in json.dumps(r.body) for r in o.llm.requests)
    [denied] = events(caplog, "discord_message_denied")
    assert denied["user_id"] == o.bob.id
    [caught_up] = events(caplog, "discord_caught_up")
    assert caught_up["read"] == 4 and caught_up["handed_over"] == 1  # with the bot's own reply


async def test_a_chat_whose_history_cannot_be_read_stops_neither_the_others_nor_the_bot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with offline(tmp_path) as o:
        async with o.run():
            await o.mention(o.general, o.guild, o.alice, "hi all")
            await o.discord.wait_for_bot_messages(o.general, 1)
            await o.dm_from_alice("hello")
            await o.discord.wait_for_bot_messages(o.dm, 1)
        o.discord.refuse_channel(o.general, MISSING_ACCESS)  # the bot lost View Channel there
        await o.mention(o.general, o.guild, o.alice, "can you see this?")
        await o.dm_from_alice("while you were away")
        async with o.run() as (_, channel):
            await o.discord.wait_for_bot_messages(o.dm, 2)
            await o.dm_from_alice("live")
            await o.discord.wait_for_bot_messages(o.dm, 3)
            assert channel.health.state == "running"
        assert o.discord.bot_texts(o.dm) == ["echo: hello", "echo: while you were away", "echo: live"]
        assert o.discord.bot_texts(o.general) == ["echo: alice: hi all"]
        marks = json.loads((o.workspace / "state" / SEEN_FILE).read_text())["newest"]
        assert o.general not in marks and o.dm in marks  # no longer read at every start
    [failed] = events(caplog, "discord_catch_up_failed")
    assert failed["chat_id"] == o.general and "View Channel" in failed["reason"]


async def test_a_session_that_could_not_resume_catches_up_and_a_resumed_one_does_not(
    tmp_path: Path,
) -> None:
    async with offline(tmp_path) as o:
        d = o.discord
        history = f"/channels/{o.dm}/messages"
        async with o.run():
            await o.dm_from_alice("hello")
            await d.wait_for_bot_messages(o.dm, 1)
            reads = sum(r.method == "GET" and r.path == history for r in d.requests)
            d.invalidate_session()  # the next RESUME is refused: the client identifies anew
            await d.drop()
            await o.dm_from_alice("while the session was lost")
            await d.wait_for_bot_messages(o.dm, 2)
            assert len(d.identifies) == 2
            assert sum(r.method == "GET" and r.path == history for r in d.requests) == reads + 1
            await d.drop()  # this time the session resumes, and Discord replays what was missed
            await d.wait_until(lambda: d.resumes == 1 and d.connected)
            await o.dm_from_alice("after the resume")
            await d.wait_for_bot_messages(o.dm, 3)
            assert sum(r.method == "GET" and r.path == history for r in d.requests) == reads + 1
        assert d.bot_texts(o.dm) == [
            "echo: hello",
            "echo: while the session was lost",
            "echo: after the resume",
        ]


async def test_commands_a_full_catch_up_reads_again_are_not_run_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A catch-up reads up to ``catch_up_max_messages`` (50) again when the mark on disk lags: here a /new,
    23 commands and a message, each with its answer. The session noted only the latest 20 commands run,
    so the /new and the oldest /help ran again: the /new cleared the conversation a second time."""
    async with offline(tmp_path) as o:
        async with o.run():
            hello = await o.dm_from_alice("hello")
            await o.discord.wait_for_bot_messages(o.dm, 1)
            commands = ["/new", *["/help"] * 23]
            for count, text in enumerate([*commands, "thanks"], start=2):  # one at a time, as typed
                thanks = await o.dm_from_alice(text)
                await o.discord.wait_for_bot_messages(o.dm, count)  # ("thanks": its turn saves the notes)
        before = o.discord.bot_texts(o.dm)
        marks = o.workspace / "state" / SEEN_FILE  # as if no mark was written after "hello"'s
        marks.write_text(json.dumps({"newest": {o.dm: hello["id"]}}))
        o.discord.rate_limit("GET", f"/channels/{o.dm}/messages", retry_after=0.5)  # "live" comes first
        async with o.run():
            live = await o.dm_from_alice("live")  # written while the catch-up runs: not one of the 50
            await o.discord.wait_until(lambda: "echo: live" in o.discord.bot_texts(o.dm))
        [caught_up] = events(caplog, "discord_caught_up")[-1:]
        assert caught_up["read"] == 51  # the /new, the 23 /help, "thanks", their 25 answers, and "live"
        assert caught_up["skipped"] == 1  # the answer to "hello"
        assert o.discord.bot_texts(o.dm) == [*before, "echo: live"]
    assert len(events(caplog, "duplicate_command_ignored")) == len(commands)
    duplicates = [e["message_id"] for e in events(caplog, "duplicate_message_ignored")]
    assert duplicates == [thanks["id"], live["id"]]  # "live" read with the history, then live


async def test_a_message_read_again_after_a_new_cleared_it_is_not_answered_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The session's history is how a message read again is recognized, and /new (or memory's trim of a
    long session) takes it out of there: the message was answered again, into the fresh conversation."""
    async with offline(tmp_path) as o:
        async with o.run():
            hello = await o.dm_from_alice("hello")
            await o.discord.wait_for_bot_messages(o.dm, 1)
            locker = await o.dm_from_alice("my locker code is 4512")
            await o.discord.wait_for_bot_messages(o.dm, 2)
            await o.dm_from_alice("/new")
            await o.discord.wait_for_bot_messages(o.dm, 3)
        before = o.discord.bot_texts(o.dm)
        marks = o.workspace / "state" / SEEN_FILE  # as if no mark was written after "hello"'s
        marks.write_text(json.dumps({"newest": {o.dm: hello["id"]}}))
        async with o.run():
            await o.dm_from_alice("live")
            await o.discord.wait_until(lambda: "echo: live" in o.discord.bot_texts(o.dm))
        assert o.discord.bot_texts(o.dm) == [*before, "echo: live"]
    assert locker["id"] in [e["message_id"] for e in events(caplog, "duplicate_message_ignored")]
