"""End to end: a pairing.json the bot cannot read (here: written by a newer membot) while users admitted
by pairing write to it.

Whether such a user is heard cannot be told then. Their DM used to make discord.py's event handler
raise (a traceback per message, ``discord_event_failed``) and was answered only at a later catch-up, if
at all; their slash command got no answer, so Discord showed "The application did not respond". Now the
DM waits, in order, and is taken in once the file is fixed, other chats going on meanwhile; the slash
command gets a plain ephemeral "try again later"; the operator's log names the file and the fix once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.pairing import PAIRING_FILE, PairingStore
from channels.discord import DiscordChannel
from tests.channels.discord.kit import running_bot
from tests.fakes.discord_server import FakeDiscord, FakeUser, Guild
from tests.fakes.llm_server import FakeLLMServer

WHAT = "checking Discord pairings"
CANNOT_CHECK = "Sorry, I can't check your access right now. Please try again later."  # no path, no error


@dataclass
class Setting:
    discord: FakeDiscord
    llm: FakeLLMServer
    workspace: Path
    alice: FakeUser  # in allowed_users
    dm: str  # alice's DM
    guild: Guild  # allowed
    quiet: str  # a channel of it where no mention is needed
    section: dict[str, Any]

    @property
    def pairing_file(self) -> Path:
        return self.workspace / PAIRING_FILE

    def run(self) -> contextlib.AbstractAsyncContextManager[tuple[Any, DiscordChannel]]:
        return running_bot(self.discord, self.llm, self.workspace, self.section, storage_retry=(0.02, 0.2))

    async def paired(self, name: str) -> tuple[FakeUser, str]:
        """A user the operator approved through pairing, and their DM with the bot."""
        user = self.discord.user(name)
        store = PairingStore(self.pairing_file)
        code = await store.request(DiscordChannel.name, user.id, name)
        assert code is not None and await store.approve(code) is not None
        return user, self.discord.dm_channel()

    def set_version(self, version: int) -> None:
        """Rewrite pairing.json with ``version``: 2 is a newer membot's (refused), 1 this one's."""
        data = json.loads(self.pairing_file.read_text())
        data["version"] = version
        temporary = self.pairing_file.with_name("pairing.json.tmp")
        temporary.write_text(json.dumps(data))
        os.replace(temporary, self.pairing_file)


@contextlib.asynccontextmanager
async def setting(tmp_path: Path) -> AsyncIterator[Setting]:
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        guild = fake.add_guild("home")
        quiet = fake.add_channel(guild, "quiet")
        alice = fake.user("alice")
        section = {
            "allowed_users": [alice.id],
            "allowed_guilds": [guild.id],
            "mention_overrides": {quiet: False},
            "sync_commands": False,
        }
        yield Setting(fake, llm, tmp_path / "ws", alice, fake.dm_channel(), guild, quiet, section)


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


async def until(predicate: Callable[[], object]) -> None:
    """Wait for what the log or the channel's health says (no event to await there)."""
    async with asyncio.timeout(10):
        while not predicate():
            await asyncio.sleep(0.01)


def outage_logged_once(caplog: pytest.LogCaptureFixture, path: Path) -> None:
    """One line for the whole wait, naming the file and the fix; no traceback per message."""
    [outage] = [e for e in logged(caplog, "storage_unavailable") if e["what"] == WHAT]
    assert str(path) in outage["error"] and "written by a newer membot" in outage["error"]
    assert "run that membot again, or restore a backup" in outage["error"]
    assert "taken in once it can be read" in outage["hint"]  # (not the full disk's "free disk space")
    assert logged(caplog, "discord_event_failed") == []
    assert logged(caplog, "discord_catch_up_failed") == []


async def test_a_paired_users_dms_wait_for_pairing_json_and_are_answered_once_it_is_fixed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with setting(tmp_path) as s:
        d = s.discord
        bob, bob_dm = await s.paired("bob")
        async with s.run() as (_, channel):
            s.set_version(2)
            await d.user_message(channel_id=bob_dm, author=bob, content="first")
            await until(lambda: logged(caplog, "storage_unavailable"))
            await d.user_message(channel_id=bob_dm, author=bob, content="second")
            # Others go on meanwhile: an allowed user's DM, a server channel.
            await d.user_message(channel_id=s.dm, author=s.alice, content="hello")
            await d.user_message(channel_id=s.quiet, author=bob, content="anyone?", guild=s.guild)
            await d.wait_for_bot_messages(s.dm)
            await d.wait_for_bot_messages(s.quiet)
            assert d.bot_texts(bob_dm) == [] and WHAT in channel.health.storage_errors
            s.set_version(1)  # the operator's fix
            await d.wait_for_bot_messages(bob_dm, 2)
            await until(lambda: logged(caplog, "storage_recovered"))
            assert channel.health.storage_errors == {}
        assert d.bot_texts(bob_dm) == ["echo: first", "echo: second"]  # in order, once each
        assert d.bot_texts(s.dm) == ["echo: hello"]
    outage_logged_once(caplog, s.pairing_file)


async def test_a_slash_command_that_needs_pairing_gets_a_plain_try_again_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Discord wants an answer within 3 s: it cannot wait for the operator, and got none at all."""
    async with setting(tmp_path) as s:
        d = s.discord
        bob, bob_dm = await s.paired("bob")
        mallory, mallory_dm = d.user("mallory"), d.dm_channel()  # a stranger: pairing decides too
        async with s.run():
            s.set_version(2)
            for user, dm in ((bob, bob_dm), (mallory, mallory_dm)):
                interaction = await d.slash_command("status", channel_id=dm, user=user)
                [answer] = await d.wait_for_followups(interaction["token"])
                assert answer["content"] == CANNOT_CHECK
                assert dict(d.interaction_responses)[interaction["id"]]["data"]["flags"] == 64
            allowed = await d.slash_command("status", channel_id=s.dm, user=s.alice)
            [status] = await d.wait_for_followups(allowed["token"])
            assert status["content"] != CANNOT_CHECK
            s.set_version(1)
            again = await d.slash_command("status", channel_id=bob_dm, user=bob)
            [reply] = await d.wait_for_followups(again["token"])
            assert reply["content"] != CANNOT_CHECK
            assert dict(d.interaction_responses)[again["id"]] == {"type": 5}  # "thinking", then the reply
        # The pairing read ends the outage though no message waited (a later one is logged anew).
        assert [e["what"] for e in logged(caplog, "storage_recovered")] == [WHAT]
    outage_logged_once(caplog, s.pairing_file)


async def test_the_catch_up_keeps_paired_dms_waiting_without_holding_back_the_other_chats(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The catch-up reads 4 chats at once; 4 DMs waiting for the file held every other chat's."""
    async with setting(tmp_path) as s:
        d = s.discord
        users = [await s.paired(f"user{n}") for n in range(4)]
        async with s.run():  # each chat is tracked from its first answer, alice's last
            for user, dm in users:
                await d.user_message(channel_id=dm, author=user, content="hi")
                await d.wait_for_bot_messages(dm)
            await d.user_message(channel_id=s.dm, author=s.alice, content="hi")
            await d.wait_for_bot_messages(s.dm)
        s.set_version(2)
        for user, dm in users:  # written while the bot is down: only the history has them
            await d.user_message(channel_id=dm, author=user, content="while away")
        await d.user_message(channel_id=s.dm, author=s.alice, content="while away")
        async with s.run():
            await d.wait_for_bot_messages(s.dm, 2)
            assert [len(d.bot_texts(dm)) for _, dm in users] == [1, 1, 1, 1]
            s.set_version(1)
            for _, dm in users:
                await d.wait_for_bot_messages(dm, 2)
        for _, dm in users:
            assert d.bot_texts(dm) == ["echo: hi", "echo: while away"]
        assert d.bot_texts(s.dm) == ["echo: hi", "echo: while away"]
    outage_logged_once(caplog, s.pairing_file)


async def test_a_stop_while_a_dm_waits_leaves_it_to_the_next_starts_catch_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with setting(tmp_path) as s:
        d = s.discord
        bob, bob_dm = await s.paired("bob")
        async with s.run() as (_, channel):
            await d.user_message(channel_id=bob_dm, author=bob, content="hi")  # the chat is tracked
            await d.wait_for_bot_messages(bob_dm)
            s.set_version(2)
            await d.user_message(channel_id=bob_dm, author=bob, content="still there?")
            await until(lambda: logged(caplog, "storage_unavailable"))
        # Stopped: nothing waits on (it went on into a stopped channel once the file was fixed).
        handlers = [t for t in asyncio.all_tasks() if t.get_name().startswith("discord.py: on_message")]
        assert handlers == [] and channel.health.storage_errors == {}
        s.set_version(1)
        async with s.run():
            await d.wait_for_bot_messages(bob_dm, 2)
        assert d.bot_texts(bob_dm) == ["echo: hi", "echo: still there?"]
    outage_logged_once(caplog, s.pairing_file)


async def test_a_stop_while_a_caught_up_dm_waits_stops_the_other_chats_catch_up_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The stop cancelled the waiting DM's part of the catch-up first, which ended the catch-up as if
    cancelled but left its other chats' parts running past the channel's stop (a read, a hand-over)."""
    async with setting(tmp_path) as s:
        d = s.discord
        bob, bob_dm = await s.paired("bob")
        async with s.run():  # both chats tracked
            for user, dm in ((bob, bob_dm), (s.alice, s.dm)):
                await d.user_message(channel_id=dm, author=user, content="hi")
                await d.wait_for_bot_messages(dm)
        s.set_version(2)
        for user, dm in ((bob, bob_dm), (s.alice, s.dm)):  # while the bot is down
            await d.user_message(channel_id=dm, author=user, content="while away")
        d.rate_limit("GET", f"/channels/{s.dm}/messages", retry_after=5)  # alice's read is under way
        async with s.run():
            await until(lambda: logged(caplog, "storage_unavailable"))
            await until(lambda: any(r.path.startswith(f"/channels/{s.dm}/messages") for r in d.requests))
        left = [t for t in asyncio.all_tasks() if "CatchUp._run" in getattr(t.get_coro(), "__qualname__", "")]
        assert left == []


async def test_a_stop_while_two_dms_of_a_chat_wait_leaves_no_handler_waiting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The stop cancelled the DM that waited for pairing.json; the next one of the chat, queued behind it
    for the chat's lock, then took it and waited in turn, past the stop, asking the file on and on."""
    async with setting(tmp_path) as s:
        d = s.discord
        bob, bob_dm = await s.paired("bob")
        async with s.run() as (_, channel):
            await d.user_message(channel_id=bob_dm, author=bob, content="hi")  # the chat is tracked
            await d.wait_for_bot_messages(bob_dm)
            s.set_version(2)
            await d.user_message(channel_id=bob_dm, author=bob, content="still there?")
            await until(lambda: logged(caplog, "storage_unavailable"))
            await d.user_message(channel_id=bob_dm, author=bob, content="hello?")
            await until(lambda: len(_handlers()) == 2)
        assert _handlers() == [] and channel.health.storage_errors == {}
        s.set_version(1)
        async with s.run():
            await d.wait_for_bot_messages(bob_dm, 3)
        assert d.bot_texts(bob_dm) == ["echo: hi", "echo: still there?", "echo: hello?"]


def _handlers() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("discord.py: on_message")]
