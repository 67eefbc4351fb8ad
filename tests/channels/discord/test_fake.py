"""The fake Discord keeps the real service's rules; checked here with a bare discord.py client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import discord
import pytest
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

from tests.fakes.discord_server import FakeDiscord


class _Client(discord.Client):
    def __init__(self, intents: discord.Intents) -> None:
        super().__init__(intents=intents, guild_ready_timeout=0.05)
        self.ready = asyncio.Event()
        self.received: list[discord.Message] = []
        self.arrived = asyncio.Condition()

    async def on_ready(self) -> None:
        self.ready.set()

    async def on_message(self, message: discord.Message) -> None:
        async with self.arrived:
            self.received.append(message)
            self.arrived.notify_all()

    async def wait_for_count(self, count: int) -> list[discord.Message]:
        async with asyncio.timeout(5), self.arrived:
            await self.arrived.wait_for(lambda: len(self.received) >= count)
        return self.received


@contextlib.asynccontextmanager
async def connected(fake: FakeDiscord, *, message_content: bool) -> AsyncIterator[_Client]:
    saved = Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = fake.api_base, yarl.URL(fake.gateway_url)
    intents = discord.Intents.default()
    intents.message_content = message_content
    client = _Client(intents)
    task = asyncio.create_task(client.start(fake.token))
    try:
        async with asyncio.timeout(5):
            await client.ready.wait()
        yield client
    finally:
        await client.close()
        await asyncio.gather(task, return_exceptions=True)
        Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = saved


async def test_without_message_content_guild_messages_arrive_blank_unless_they_mention_the_bot() -> None:
    async with FakeDiscord() as fake:
        guild = fake.add_guild()
        channel = fake.add_channel(guild)
        alice = fake.user("alice")
        async with connected(fake, message_content=False) as client:
            await fake.user_message(channel_id=channel, author=alice, content="secret", guild=guild)
            await fake.user_message(
                channel_id=channel,
                author=alice,
                content=f"{fake.bot.mention} hi",
                guild=guild,
                mentions=(fake.bot,),
            )
            await fake.user_message(channel_id=fake.dm_channel(), author=alice, content="in a DM")
            received = await client.wait_for_count(3)
        assert [m.content for m in received] == ["", f"{fake.bot.mention} hi", "in a DM"]


async def test_content_over_2000_characters_is_refused_with_50035() -> None:
    async with FakeDiscord() as fake:
        async with connected(fake, message_content=True) as client:
            target = client.get_partial_messageable(int(fake.dm_channel()))
            with pytest.raises(discord.HTTPException) as refused:
                await target.send("x" * 2001)
            ok = await target.send("x" * 2000)
        assert refused.value.status == 400 and refused.value.code == 50035
        assert len(ok.content) == 2000


async def test_a_429_with_via_is_retried_by_the_library() -> None:
    async with FakeDiscord() as fake:
        async with connected(fake, message_content=True) as client:
            channel = fake.dm_channel()
            fake.rate_limit("POST", f"/channels/{channel}/messages", times=1, retry_after=0.01)
            sent = await client.get_partial_messageable(int(channel)).send("after a 429")
        posts = [r for r in fake.requests if r.path == f"/channels/{channel}/messages"]
        assert sent.content == "after a 429" and len(posts) == 2  # Via marks it as Discord's, not a ban


async def test_a_dropped_connection_resumes_the_same_session() -> None:
    async with FakeDiscord() as fake:
        async with connected(fake, message_content=True):
            await fake.drop()
            await fake.wait_until(lambda: fake.resumes == 1 and fake.connected)
        assert len(fake.identifies) == 1


async def test_the_history_pages_as_discord_lists_it() -> None:
    """``after`` lists the oldest after a point, no anchor the newest, ``before`` the ones below; always
    newest first, and at most 100 a page: discord.py's ``history`` relies on all of it to page."""
    async with FakeDiscord() as fake:
        channel, alice = fake.dm_channel(), fake.user("alice")
        written = [
            await fake.user_message(channel_id=channel, author=alice, content=f"{n}") for n in range(250)
        ]
        ids = [int(m["id"]) for m in written]
        async with connected(fake, message_content=True) as client:
            chat = client.get_partial_messageable(int(channel))
            oldest = [m.id async for m in chat.history(limit=150, after=discord.Object(ids[9]))]
            top = chat.history(limit=120, after=discord.Object(ids[9]), oldest_first=False)
            newest = [m.id async for m in top]
            near = chat.history(limit=5, after=discord.Object(ids[246]), oldest_first=False)
            short = [m.id async for m in near]
            with pytest.raises(discord.HTTPException) as refused:
                await client.http.logs_from(int(channel), 101)
        assert oldest == ids[10:160]
        assert newest == ids[130:][::-1]  # two pages: the newest 100, then 20 before them
        assert short == ids[247:][::-1]  # (discord.py drops what is not after the point)
        assert refused.value.status == 400 and refused.value.code == 50035


async def test_a_nonce_holds_for_a_few_minutes_and_a_deleted_message_cannot_be_edited() -> None:
    async with FakeDiscord() as fake:
        async with connected(fake, message_content=True) as client:
            chat = client.get_partial_messageable(int(fake.dm_channel()))
            first = await chat.send("once", nonce="n-1")  # discord.py sets enforce_nonce with a nonce
            again = await chat.send("once", nonce="n-1")
            fake.forget_nonces()  # minutes pass
            later = await chat.send("once", nonce="n-1")
            fake.delete_message(str(first.id))
            with pytest.raises(discord.NotFound) as gone:
                await chat.get_partial_message(first.id).edit(content="edited")
        assert again.id == first.id and later.id != first.id
        assert [m["id"] for m in fake.bot_messages] == [str(later.id)]
        assert gone.value.code == 10008


async def test_a_fault_can_pick_requests_by_their_body() -> None:
    async with FakeDiscord() as fake:
        async with connected(fake, message_content=True) as client:
            chat = client.get_partial_messageable(int(fake.dm_channel()))
            fake.fail("POST", "/channels/", times=5, when=lambda body: body.get("content") == "no")
            await chat.send("yes")
            with pytest.raises(discord.DiscordServerError):
                await chat.send("no")
            fake.clear_faults()
            await chat.send("no")
        assert [m["content"] for m in fake.bot_messages] == ["yes", "no"]
