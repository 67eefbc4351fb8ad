"""End to end: the real discord.py against the fake Discord, through the real dispatcher, pipeline and fake LLM."""

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
from discord.gateway import DiscordWebSocket
from discord.http import Route

from bot.app import Core
from bot.commands import CommandCall, SessionControl
from bot.errors import ChannelError
from bot.model_wait import NOTICE as MODEL_NOTICE
from bot.pairing import PAIRING_FILE, PairingStore, approve_code
from channels.discord import DiscordChannel
from tests.channels.discord.kit import running_bot
from tests.fakes.discord_server import CdnFile, FakeDiscord, FakeUser, Guild, snowflake
from tests.fakes.llm_server import FakeLLMServer, FakeReply


@dataclass
class World:
    discord: FakeDiscord
    llm: FakeLLMServer
    core: Core
    channel: DiscordChannel
    workspace: Path
    alice: FakeUser  # allowed user
    bob: FakeUser  # a stranger
    dm: str  # alice's DM channel
    bob_dm: str
    guild: Guild  # allowed guild
    general: str
    quiet: str  # a channel where no mention is needed
    thread: str  # a thread under general
    other_guild: Guild  # not allowed
    other_channel: str

    def user_texts(self) -> list[str]:
        """The last user message of every request the model got."""
        texts = []
        for request in self.llm.requests:
            users = [m for m in request.body["messages"] if m["role"] == "user"]
            content = users[-1]["content"]
            texts.append(content if isinstance(content, str) else json.dumps(content))
        return texts


@contextlib.asynccontextmanager
async def discord_world(
    tmp_path: Path,
    *,
    discord_settings: dict[str, Any] | None = None,
    configure: Callable[[World], None] | None = None,
    vision: bool = True,
    **settings: dict[str, Any],
) -> AsyncIterator[World]:
    """The bot with Discord in a fake world; ``settings``: ``llm_settings`` or ``dispatcher`` to add."""
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        guild = fake.add_guild("home")
        general = fake.add_channel(guild, "general")
        quiet = fake.add_channel(guild, "quiet")
        thread = fake.add_thread(guild, general, "ideas")
        other_guild = fake.add_guild("elsewhere")
        other_channel = fake.add_channel(other_guild, "lobby")
        alice, bob = fake.user("alice"), fake.user("bob")
        workspace = tmp_path / "ws"
        section: dict[str, Any] = {
            "allowed_users": [alice.id],
            "allowed_guilds": [guild.id],
            "mention_overrides": {quiet: False},
        }
        section.update(discord_settings or {})
        worlds: list[World] = []

        def build(core: Core, channel: DiscordChannel) -> None:
            world = World(
                fake, llm, core, channel, workspace, alice, bob, fake.dm_channel(), fake.dm_channel(),
                guild, general, quiet, thread, other_guild, other_channel,
            )  # fmt: skip
            worlds.append(world)
            if configure is not None:
                configure(world)

        async with running_bot(fake, llm, workspace, section, vision=vision, before_start=build, **settings):
            yield worlds[0]


async def test_dm_round_trip_through_the_whole_pipeline(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:
        sent = await w.discord.user_message(channel_id=w.dm, author=w.alice, content="hello there")
        [reply] = await w.discord.wait_for_bot_messages(w.dm)
        assert reply["content"] == "echo: hello there"
        assert str(reply["message_reference"]["message_id"]) == sent["id"]  # the first chunk replies
        assert reply["allowed_mentions"] == {"parse": [], "users": [int(w.alice.id)], "replied_user": True}
        assert w.dm in w.discord.typing
        session = json.loads((w.workspace / "sessions" / f"discord:{w.dm}.json").read_text())
        assert session["log_count"] == 2
        assert w.channel.health.state == "running"


async def test_guild_messages_need_a_mention_or_a_reply(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:
        d, bot = w.discord, w.discord.bot
        await d.user_message(channel_id=w.general, author=w.bob, content="just chatting", guild=w.guild)
        await d.user_message(
            channel_id=w.general,
            author=w.bob,
            content=f"{bot.mention} ask {w.alice.mention} about <#{w.quiet}>",
            guild=w.guild,
            mentions=(bot, w.alice),
        )
        [first] = await d.wait_for_bot_messages(w.general)
        # The bot mention gone, others readable; in a guild the model hears who is speaking.
        assert first["content"] == "echo: bob: ask @alice about #quiet"
        assert first["allowed_mentions"]["parse"] == []  # never @everyone or roles
        await d.user_message(
            channel_id=w.general, author=w.bob, content="and more?", guild=w.guild, reply_to=first
        )
        await d.wait_for_bot_messages(w.general, 2)
        role = w.guild.bot_role  # "@membot" picked in a client is often the bot's own role
        await d.user_message(
            channel_id=w.general, author=w.bob, content=f"<@&{role}> and by role?", guild=w.guild,
            role_mentions=(role,),
        )  # fmt: skip
        await d.wait_for_bot_messages(w.general, 3)
        await d.user_message(
            channel_id=w.quiet, author=w.bob, content="no mention needed here", guild=w.guild
        )
        await d.wait_for_bot_messages(w.quiet)
        alices = await d.user_message(
            channel_id=w.quiet, author=w.alice, content="The earth is flat", guild=w.guild
        )
        await d.wait_for_bot_messages(w.quiet, 2)
        await d.user_message(
            channel_id=w.quiet, author=w.bob, content="is this true?", guild=w.guild, reply_to=alices
        )
        await d.wait_for_bot_messages(w.quiet, 3)
        assert w.user_texts() == [
            "bob: ask @alice about #quiet",
            "bob: and more?",  # a reply to the bot: its own words are in the history already
            "bob: and by role?",
            "bob: no mention needed here",
            "alice: The earth is flat",
            'bob: [replying to alice: "The earth is flat"]\nis this true?',
        ]


async def test_each_thread_is_its_own_session(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:
        d, bot = w.discord, w.discord.bot
        await d.user_message(
            channel_id=w.general,
            author=w.bob,
            content=f"{bot.mention} channel secret",
            guild=w.guild,
            mentions=(bot,),
        )
        await d.wait_for_bot_messages(w.general)
        await d.user_message(
            channel_id=w.thread,
            author=w.bob,
            content=f"{bot.mention} thread question",
            guild=w.guild,
            mentions=(bot,),
        )
        await d.wait_for_bot_messages(w.thread)
        # The thread's conversation history is its own; shared memory (notes) lives in the system prompt.
        history = [m for m in w.llm.requests[-1].body["messages"] if m["role"] != "system"]
        thread_request = json.dumps(history)
        assert "thread question" in thread_request and "channel secret" not in thread_request
        sessions = {p.name for p in (w.workspace / "sessions").glob("discord:*.json")}
        assert sessions == {f"discord:{w.general}.json", f"discord:{w.thread}.json"}


async def test_strangers_are_denied_and_dm_strangers_can_pair(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:
        d, bot = w.discord, w.discord.bot
        await d.user_message(
            channel_id=w.other_channel,
            author=w.bob,
            content=f"{bot.mention} hi",
            guild=w.other_guild,
            mentions=(bot,),
        )
        await d.user_message(channel_id=w.bob_dm, author=w.bob, content="let me in")
        [answer] = await d.wait_for_bot_messages(w.bob_dm)
        assert "membot pairing approve" in answer["content"]
        code = answer["content"].split("approve ")[1].strip("`")
        assert w.llm.requests == [] and d.bot_texts(w.other_channel) == []

        assert await asyncio.to_thread(approve_code, w.workspace, code) is not None
        await d.user_message(channel_id=w.bob_dm, author=w.bob, content="thanks")
        replies = await d.wait_for_bot_messages(w.bob_dm, 2)
        assert replies[-1]["content"] == "echo: thanks"
        assert w.user_texts() == ["thanks"]  # "let me in" never reached the model


async def test_a_stranger_whose_dms_are_closed_is_a_warning_not_a_failed_event_handler(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The pairing offer Discord refused (403, 50007: the stranger takes no DMs from the bot) raised out
    of the event handler: discord_event_failed with a traceback. Telegram logs it and goes on; so does
    Discord now. The code stays pending, and once approved the user is answered."""
    async with discord_world(tmp_path) as w:
        d = w.discord
        d.refuse_channel(w.bob_dm)
        await d.user_message(channel_id=w.bob_dm, author=w.bob, content="let me in")
        offer_path = f"/channels/{w.bob_dm}/messages"
        await d.wait_until(lambda: any(r.method == "POST" and r.path == offer_path for r in d.requests))
        [request] = await PairingStore(w.workspace / PAIRING_FILE).pending()
        d.allow_channel(w.bob_dm)
        assert await asyncio.to_thread(approve_code, w.workspace, request.code) is not None
        await d.user_message(channel_id=w.bob_dm, author=w.bob, content="thanks")  # after the first, in order
        [reply] = await d.wait_for_bot_messages(w.bob_dm)
        assert reply["content"] == "echo: thanks"
    events = [r.msg for r in caplog.records if isinstance(r.msg, dict)]
    assert not [e for e in events if e.get("event") == "discord_event_failed"]
    [warning] = [
        r
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg.get("event") == "discord_pairing_offer_not_sent"
    ]
    assert (
        warning.levelname == "WARNING"
        and "Discord does not let the bot message this user" in warning.msg["reason"]
    )


async def test_a_strangers_dm_flood_gets_one_offer(tmp_path: Path) -> None:
    """Each offer is a write of pairing.json and a message out: a flood gets one a minute."""
    async with discord_world(tmp_path) as w:
        d = w.discord
        mallory, mallory_dm = d.user("mallory"), d.dm_channel()
        for n in range(5):
            await d.user_message(channel_id=mallory_dm, author=mallory, content=f"let me in {n}")
        await d.user_message(channel_id=w.dm, author=w.alice, content="hello")
        await d.wait_for_bot_messages(w.dm)
        await asyncio.sleep(0.5)  # (the stranger's DMs are taken in beside alice's, not before)
        [offer] = d.bot_texts(mallory_dm)
        assert "membot pairing approve" in offer and w.user_texts() == ["hello"]


async def test_a_strangers_flood_of_slash_commands_writes_pairing_json_once(tmp_path: Path) -> None:
    """A slash command must be answered, so each of a stranger's is (the same code, ephemeral); but each
    asked the pairing store again, and every ask rewrote and fsynced pairing.json."""
    async with discord_world(tmp_path) as w:
        d = w.discord
        mallory, mallory_dm = d.user("mallory"), d.dm_channel()
        path = w.workspace / PAIRING_FILE
        first = await d.slash_command("status", channel_id=mallory_dm, user=mallory)
        [offer] = await d.wait_for_followups(first["token"])
        written = await asyncio.to_thread(os.stat, path)
        for _ in range(5):
            again = await d.slash_command("help", channel_id=mallory_dm, user=mallory)
            [same] = await d.wait_for_followups(again["token"])
            assert same["content"] == offer["content"] and "membot pairing approve" in same["content"]
        now = await asyncio.to_thread(os.stat, path)
        assert (now.st_ino, now.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
        assert w.llm.requests == []


async def test_chats_seen_once_leave_no_intake_lock_behind(tmp_path: Path) -> None:
    """One lock per chat ever seen (every stranger's DM too) grew for as long as the bot ran."""
    async with discord_world(tmp_path) as w:
        d = w.discord
        strangers = [(d.user(f"stranger{n}"), d.dm_channel()) for n in range(5)]
        for stranger, dm in strangers:
            await d.user_message(channel_id=dm, author=stranger, content="let me in")
        await d.user_message(channel_id=w.dm, author=w.alice, content="hello")
        await d.wait_for_bot_messages(w.dm)
        for _, dm in strangers:
            await d.wait_for_bot_messages(dm)  # each offered a code: its message went all the way
        async with asyncio.timeout(10):  # the last offer's lock is let go once Discord answered it
            while len(w.channel._intake) > 0:  # (a dict of 6 locks before, for good)
                await asyncio.sleep(0.01)


async def test_pairing_off_offers_no_codes_and_keeps_users_approved_before(tmp_path: Path) -> None:
    """``pairing = false`` stops offering codes; an approval the operator gave stays until revoked."""
    async with discord_world(tmp_path, discord_settings={"pairing": False}) as w:
        d, bob = w.discord, w.bob
        store = PairingStore(w.workspace / PAIRING_FILE)
        code = await store.request(DiscordChannel.name, str(bob.id), "bob")
        assert code is not None and await store.approve(code) is not None
        stranger = d.user("mallory")
        mallory_dm = d.dm_channel()
        await d.user_message(channel_id=mallory_dm, author=stranger, content="let me in")
        await d.user_message(channel_id=w.bob_dm, author=bob, content="still here")
        [reply] = await d.wait_for_bot_messages(w.bob_dm)
        assert reply["content"] == "echo: still here"
        interaction = await d.slash_command("status", channel_id=mallory_dm, user=stranger)
        [refusal] = await d.wait_for_followups(interaction["token"])
        assert refusal["content"] == "Sorry, I'm not allowed to answer here."
        assert d.bot_texts(mallory_dm) == [refusal["content"]] and w.user_texts() == ["still here"]
        assert await store.pending() == []  # no code was issued to the stranger


@pytest.mark.parametrize(
    ("text", "slash", "options", "expect"),
    [
        ("/status", "status", (), "Model: GPT-4.1 mini"),
        ("/compact 5", "compact", (("keep", 4, 5),), "Nothing to compact yet."),
        ("/new", "new", (), "Session cleared."),
        ("/stop", "stop", (), "Nothing is running."),
        ("/help", "help", (), "/compact"),
    ],
)
async def test_commands_as_text_and_as_slash_commands(
    tmp_path: Path, text: str, slash: str, options: tuple[tuple[str, int, Any], ...], expect: str
) -> None:
    async with discord_world(tmp_path) as w:
        d = w.discord
        await d.user_message(channel_id=w.dm, author=w.alice, content=text)
        [reply] = await d.wait_for_bot_messages(w.dm)
        assert expect in reply["content"]

        interaction = await d.slash_command(slash, channel_id=w.dm, user=w.alice, options=options)
        [answer] = await d.wait_for_followups(interaction["token"])
        assert expect in answer["content"]
        assert d.interaction_responses == [(interaction["id"], {"type": 5})]  # deferred first ("thinking")
        assert w.llm.requests == []  # commands never reach the model
        await d.wait_until(lambda: d.command_puts == 1)
        assert {c["name"] for c in d.commands} >= {"status", "compact", "new", "stop", "help"}


async def test_a_deferral_whose_answer_was_lost_is_still_answered_in_place(tmp_path: Path) -> None:
    """Discord took the "thinking" but its answer never came back: the retry was refused (40060), the
    reply went to the channel, and "membot is thinking…" stayed up for good."""
    async with discord_world(tmp_path) as w:
        d = w.discord
        d.cut_after_commit("POST", "/interactions/")
        interaction = await d.slash_command("help", channel_id=w.dm, user=w.alice)
        [answer] = await d.wait_for_followups(interaction["token"])
        assert "Commands:" in answer["content"]
        assert d._interactions[interaction["token"]].get("original") is not None  # the "thinking", replaced


async def test_a_slash_command_is_deferred_while_its_chat_is_busy(tmp_path: Path) -> None:
    """Discord drops an interaction not answered within 3 s. The "thinking" waited for the chat's intake
    lock, held as long as an earlier message's attachments were downloading (up to download_timeout, a
    minute by default) or the chat was being caught up: the command failed in the user's client."""
    async with discord_world(tmp_path) as w:
        d = w.discord
        slow = CdnFile("slow.txt", "text/plain", b"abc", drip=0.05)  # a download that goes on and on
        await d.user_message(channel_id=w.dm, author=w.alice, content="read this", attachments=(slow,))
        await d.wait_until(lambda: slow.served > 0)  # the message holds its chat now
        interaction = await d.slash_command("help", channel_id=w.dm, user=w.alice)
        await d.wait_until(lambda: len(d.interaction_responses) == 1, timeout=5)  # long before 60 s
        assert d.interaction_responses == [(interaction["id"], {"type": 5})]
        assert w.llm.requests == []  # the message before it is still being read, and goes first


async def test_slash_commands_are_registered_only_when_they_change(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:
        state = w.workspace / "state" / "discord_commands.json"
        await w.discord.wait_until(lambda: w.discord.command_puts == 1)
        async with asyncio.timeout(5):
            while not state.exists():
                await asyncio.sleep(0.01)
        compact = next(c for c in w.discord.commands if c["name"] == "compact")
        assert compact["options"][0]["name"] == "keep"
        # Same commands after a restart: no second registration.
        await w.channel.stop()
        await w.channel.start()
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="still here?")
        await w.discord.wait_for_bot_messages(w.dm)
        assert w.discord.command_puts == 1


async def test_slash_commands_whose_registration_met_an_outage_are_registered_once_it_passes(
    tmp_path: Path,
) -> None:
    """One failed PUT (a 503, the network) at the start was logged and given up: users saw no slash
    commands until the next restart."""

    def outage(world: World) -> None:
        world.discord.fail("PUT", f"/applications/{world.discord.application_id}/commands", times=2)

    async with discord_world(tmp_path, configure=outage) as w:
        await w.discord.wait_until(lambda: w.discord.command_puts == 1)
        assert {c["name"] for c in w.discord.commands} >= {"status", "compact", "new", "stop", "help"}


async def test_webhooks_and_other_bots_are_not_answered_even_where_anyone_may_write(tmp_path: Path) -> None:
    """A webhook's message (an integration, a bridge, a followed channel of another server) has the
    webhook as its author, with no promise of a ``bot`` flag: Discord says to tell it by ``webhook_id``.
    It is no person of the allowed server, and a raw ``<@bot>`` in a followed post is no mention."""
    async with discord_world(tmp_path) as w:
        d, bot = w.discord, w.discord.bot
        hook = FakeUser(snowflake(), "News #announcements")  # the webhook is the author, "bot" unset
        await d.user_message(
            channel_id=w.quiet,
            author=hook,
            content="no mention needed here",
            guild=w.guild,
            webhook_id=hook.id,
        )
        await d.user_message(
            channel_id=w.general, author=hook, content=f"{bot.mention} hi", guild=w.guild, webhook_id=hook.id
        )
        other_bot = FakeUser(snowflake(), "otherbot", bot=True)
        await d.user_message(channel_id=w.quiet, author=other_bot, content="beep", guild=w.guild)
        await d.user_message(channel_id=w.quiet, author=w.bob, content="sentinel", guild=w.guild)
        await d.wait_for_bot_messages(w.quiet)
        await d.user_message(channel_id=w.general, author=w.bob, content=f"{bot.mention} 2", guild=w.guild)
        await d.wait_for_bot_messages(w.general)
        assert w.user_texts() == ["bob: sentinel", "bob: 2"]


async def test_slash_command_from_a_stranger_is_refused(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:
        interaction = await w.discord.slash_command(
            "status", channel_id=w.other_channel, user=w.bob, guild=w.other_guild
        )
        await w.discord.wait_until(lambda: len(w.discord.interaction_responses) == 1)
        [(_, body)] = w.discord.interaction_responses
        assert body["type"] == 4 and body["data"]["flags"] == 64  # an ephemeral refusal
        assert interaction["id"] == w.discord.interaction_responses[0][0]


FENCE = "```"


def _long_reply() -> str:
    code = "\n".join(f"    value_{i} = compute({i})  # step {i}" for i in range(80))
    prose = "\n\n".join(f"Paragraph {i}: " + "words " * 60 for i in range(8))
    return f"Intro.\n\n{FENCE}python\n{code}\n{FENCE}\n\n{prose}\n\n{FENCE}\n{code}\n{FENCE}\nThe end."


async def test_a_long_reply_is_split_under_the_limit_without_breaking_code(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:
        text = _long_reply()
        assert len(text) > 7000
        w.llm.script(FakeReply(text=text))
        sent = await w.discord.user_message(channel_id=w.dm, author=w.alice, content="write a lot")
        await w.discord.wait_until(lambda: "The end." in "".join(w.discord.bot_texts(w.dm)))
        messages = await w.discord.wait_for_bot_messages(w.dm)
        chunks = [m["content"] for m in messages]
        assert len(chunks) >= 4 and all(len(c) <= 2000 for c in chunks)
        assert all(c.count(FENCE) % 2 == 0 for c in chunks)  # every chunk closes what it opens
        assert str(messages[0]["message_reference"]["message_id"]) == sent["id"]
        assert all("message_reference" not in m for m in messages[1:])
        assert "".join(chunks).count("value_79") == 2


async def test_a_line_longer_than_a_message_is_not_cut_inside_a_link_or_bold(tmp_path: Path) -> None:
    """One line over 2000 characters is cut at a space; a cut inside "[a link](url)" or "**bold**" left
    raw Markdown halves in two messages (Discord renders each message on its own)."""
    async with discord_world(tmp_path) as w:
        span = "**bold words across a cut** and [a link with words](https://example.com/x)"
        text = "word " * 390 + span + " more" * 300 + " The end."
        w.llm.script(FakeReply(text=text))
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="one long line please")
        await w.discord.wait_until(lambda: "The end." in "".join(w.discord.bot_texts(w.dm)))
        chunks = [m["content"] for m in await w.discord.wait_for_bot_messages(w.dm)]
        assert len(chunks) == 2 and all(len(c) <= 2000 for c in chunks)
        assert all(c.count("**") % 2 == 0 and c.count("[") == c.count("](") for c in chunks)
        assert any("**bold words across a cut**" in c for c in chunks)
        assert any("[a link with words](https://example.com/x)" in c for c in chunks)
        assert " ".join(chunks).split() == text.split()


async def test_rate_limits_and_server_errors_are_retried(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:
        path = f"/channels/{w.dm}/messages"
        w.discord.rate_limit("POST", path, times=2, retry_after=0.05)
        w.discord.fail("POST", path, status=503, times=1)
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="are you there?")
        [reply] = await w.discord.wait_for_bot_messages(w.dm)
        assert reply["content"] == "echo: are you there?"
        posts = [r for r in w.discord.requests if r.method == "POST" and r.path == path]
        assert len(posts) == 4  # two 429s (the library), one 503 (ours), then success


async def test_a_retry_after_a_lost_answer_does_not_post_twice(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:
        w.discord.cut_after_commit("POST", f"/channels/{w.dm}/messages")
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="once")
        await w.discord.wait_until(
            lambda: len([r for r in w.discord.requests if r.path.endswith("/messages")]) == 2
        )
        assert w.discord.bot_texts(w.dm) == ["echo: once"]


async def test_a_reply_that_cannot_be_delivered_fails_loudly(tmp_path: Path) -> None:
    async with discord_world(tmp_path, discord_settings={"send_retries": 1}) as w:
        w.discord.fail("POST", f"/channels/{w.dm}/messages", status=503, times=10)
        from bot.domain import OutboundMessage

        with pytest.raises(ChannelError, match=w.dm):
            await w.channel.send(OutboundMessage("discord", w.dm, "lost?"))
        assert w.channel.health.send_failures == 1


async def test_gateway_drop_and_reconnect_lose_no_message(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:
        d = w.discord
        await d.user_message(channel_id=w.dm, author=w.alice, content="first")
        await d.wait_for_bot_messages(w.dm)
        await d.drop()
        await d.user_message(channel_id=w.dm, author=w.alice, content="sent while the bot was away")
        replies = await d.wait_for_bot_messages(w.dm, 2)
        assert replies[-1]["content"] == "echo: sent while the bot was away"
        await d.request_reconnect()
        await d.wait_until(lambda: d.resumes == 2)
        await d.user_message(channel_id=w.dm, author=w.alice, content="third")
        replies = await d.wait_for_bot_messages(w.dm, 3)
        assert replies[-1]["content"] == "echo: third"
        assert len(d.identifies) == 1 and d.resumes == 2  # resumed, never re-identified
        # RESUME replays only what the client had not received (discord.py sends the last sequence it
        # saw), so nothing is answered twice: no dedup needed on this side.
        assert d.bot_texts(w.dm) == ["echo: first", "echo: sent while the bot was away", "echo: third"]
        history = json.dumps(w.llm.requests[-1].body["messages"])
        assert "first" in history and "sent while the bot was away" in history


async def test_missing_message_content_intent_is_a_clear_startup_error(tmp_path: Path) -> None:
    original = (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)

    def refuse_intents(world: World) -> None:
        world.discord.privileged_intents = False

    with pytest.raises(ChannelError, match="MESSAGE CONTENT INTENT"):
        async with discord_world(tmp_path, configure=refuse_intents):
            pass
    assert original == (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY)  # nothing leaks into other tests


async def test_a_wrong_token_is_a_clear_startup_error(tmp_path: Path) -> None:
    with pytest.raises(ChannelError, match="rejected the bot token"):
        async with discord_world(tmp_path, discord_settings={"token": "not-the-token"}):
            pass


def _revoke_token(fake: FakeDiscord) -> None:
    fake.token = "a-new-token"  # reset in the developer portal: the old one is refused (4004)


def _revoke_intent(fake: FakeDiscord) -> None:
    fake.privileged_intents = False  # turned off in the developer portal: IDENTIFY is refused (4014)


@pytest.mark.parametrize(
    ("revoke", "words"),
    [(_revoke_token, "rejected the bot token"), (_revoke_intent, "MESSAGE CONTENT INTENT")],
)
async def test_a_token_or_intent_revoked_while_serving_fails_the_channel_and_says_why(
    tmp_path: Path, revoke: Callable[[FakeDiscord], None], words: str
) -> None:
    """discord.py closes the client before it raises 4004: the channel took that for its own stop and
    stayed "degraded" without a word, a process serving nothing that no supervisor restarts."""
    async with discord_world(tmp_path) as w:
        revoke(w.discord)
        w.discord.invalidate_session()
        await w.discord.drop()  # the next connection IDENTIFYs again, and is refused
        async with asyncio.timeout(10):
            while w.channel.health.state != "failed":
                await asyncio.sleep(0.01)
        assert words in str(w.channel.health.error)


async def test_attachments_images_text_and_other_files(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:
        files = (
            ("cat.png", "image/png", b"\x89PNG\r\n\x1a\nfake"),
            ("notes.md", "text/markdown", b"# Notes\nbuy milk"),
            ("archive.zip", "application/zip", b"PK\x03\x04"),
        )
        await w.discord.user_message(
            channel_id=w.dm, author=w.alice, content="see attached", attachments=files
        )
        await w.discord.wait_for_bot_messages(w.dm)
        body = json.dumps(w.llm.requests[-1].body["messages"])
        assert "image_url" in body  # the picture went to the (vision) model
        assert "buy milk" in body  # the text file was read
        assert "archive.zip (application/zip, 4 bytes) received" in body


async def test_images_are_only_acknowledged_when_the_model_cannot_see(tmp_path: Path) -> None:
    async with discord_world(tmp_path, vision=False) as w:
        files = (("cat.png", "image/png", b"\x89PNG\r\n\x1a\nfake"),)
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="look", attachments=files)
        await w.discord.wait_for_bot_messages(w.dm)
        body = json.dumps(w.llm.requests[-1].body["messages"])
        assert "image_url" not in body and "cat.png (image/png, 12 bytes) received" in body


async def test_a_long_slash_command_answer_continues_in_followups(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:

        async def essay(call: CommandCall, control: SessionControl) -> str:
            return "\n\n".join(f"part {i} " + "x" * 900 for i in range(5))

        w.core.commands.add("essay", "a long answer", essay)
        interaction = await w.discord.slash_command("essay", channel_id=w.dm, user=w.alice)
        answers = await w.discord.wait_for_followups(interaction["token"], 3)
        assert all(len(a["content"]) <= 2000 for a in answers)
        assert "part 0" in answers[0]["content"] and "part 4" in answers[-1]["content"]
        patches = [r for r in w.discord.requests if r.method == "PATCH" and r.path.endswith("/@original")]
        assert len(patches) == 1  # the deferred answer was edited once, the rest followed up


async def test_a_follow_up_whose_answer_was_lost_is_not_posted_twice(tmp_path: Path) -> None:
    """Follow-ups carry no nonce: the retry after a lost answer posted the part a second time."""
    async with discord_world(tmp_path) as w:

        async def essay(call: CommandCall, control: SessionControl) -> str:
            return "\n\n".join(f"part {i} " + "x" * 900 for i in range(5))

        w.core.commands.add("essay", "a long answer", essay)
        w.discord.cut_after_commit("POST", f"/webhooks/{w.discord.application_id}/")
        interaction = await w.discord.slash_command("essay", channel_id=w.dm, user=w.alice)
        await w.discord.wait_for_followups(interaction["token"], 3)
        await w.discord.wait_until(  # the answer's last part went out after the lost one
            lambda: any("part 4" in m["content"] for m in w.discord.bot_messages)
        )
        await asyncio.sleep(0.2)  # settle: a copy posted late would show now
        starts = [m["content"].split(" x")[0] for m in w.discord.bot_messages]
        assert starts == ["part 0", "part 2", "part 4"]  # each part once, in order


async def test_an_expired_interaction_is_answered_in_the_channel(tmp_path: Path) -> None:
    async with discord_world(tmp_path) as w:
        w.discord.fail("PATCH", f"/webhooks/{w.discord.application_id}/", status=404)
        await w.discord.slash_command("help", channel_id=w.dm, user=w.alice)
        [posted] = await w.discord.wait_for_bot_messages(w.dm)
        assert "/compact" in posted["content"] and "interaction_token" not in posted


async def test_a_streamed_answer_replies_to_its_question_not_to_a_later_one(tmp_path: Path) -> None:
    """The preview took the chat's latest message: an answer to A, streamed while B arrived, replied to B."""
    async with discord_world(
        tmp_path, discord_settings={"streaming": True, "stream_edit_interval": 0.2}
    ) as w:
        a = await w.discord.user_message(
            channel_id=w.quiet, author=w.alice, content="question A", guild=w.guild
        )
        await w.discord.wait_for_bot_messages(w.quiet)
        await w.discord.user_message(channel_id=w.quiet, author=w.alice, content="question B", guild=w.guild)
        # B's answer done, not only its preview posted: one turn streams in a chat at a time
        await w.discord.wait_until(lambda: "echo: alice: question B" in w.discord.bot_texts(w.quiet))
        show = w.channel.partial_sink(w.quiet, a["id"])  # as the dispatcher makes it for A's turn
        assert show is not None
        await show("the answer to A")
        preview = (await w.discord.wait_for_bot_messages(w.quiet, 3))[-1]
        assert str(preview["message_reference"]["message_id"]) == a["id"]


async def test_an_answer_cut_off_mid_stream_finishes_its_preview_when_the_model_is_back(
    tmp_path: Path,
) -> None:
    """The stream broke after its first words (shown in a preview), so the turn waited for the model and
    was tried again: the new try posted a second preview, and the first stayed in the chat, half an
    answer above the whole one. The answer goes into the preview its earlier try left."""
    async with discord_world(
        tmp_path,
        discord_settings={"streaming": True, "stream_edit_interval": 0.2},
        llm_settings={"max_retries": 0},
        dispatcher={"model_retry_first": 0.05, "model_retry_max": 0.1},
    ) as w:
        w.llm.script(FakeReply(text="The answer is forty-two, as it always was.", stream_error_after=1))
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="hello?")
        await w.discord.wait_until(lambda: "echo: hello?" in w.discord.bot_texts(w.dm))
        await asyncio.sleep(0.2)  # settle: a preview or answer posted late would show now
        # The preview (posted before the notice) became the answer: nothing else, and nothing twice.
        assert w.discord.bot_texts(w.dm) == ["echo: hello?", MODEL_NOTICE]


async def test_a_table_in_an_answer_arrives_as_aligned_columns(tmp_path: Path) -> None:
    """Discord renders no Markdown tables: the raw pipes were hard to read."""
    async with discord_world(tmp_path) as w:
        w.llm.script(FakeReply(text="Prices:\n\n| Item | Price |\n|---|---|\n| Tea | 3 |"))
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="prices?")
        [reply] = await w.discord.wait_for_bot_messages(w.dm)
    assert reply["content"] == "Prices:\n\n```\nItem | Price\n-----+------\nTea  | 3\n```"


async def test_streaming_edits_one_message(tmp_path: Path) -> None:
    async with discord_world(
        tmp_path, discord_settings={"streaming": True, "stream_edit_interval": 0.2}
    ) as w:
        w.llm.script(FakeReply(text="streamed " * 40))
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="stream please")
        await w.discord.wait_until(
            lambda: any(m["content"].strip() == ("streamed " * 40).strip() for m in w.discord.bot_messages)
        )
        assert len(w.discord.bot_texts(w.dm)) == 1  # one message, edited into the final answer
        assert any(r.method == "PATCH" for r in w.discord.requests)
