"""A slash command's answer after its interaction's token expired: Discord's tokens last 15 minutes (the
fake refuses an older one with 401 "Invalid Webhook Token", as Discord does). An answer that comes later
(a /new behind a long turn, a chat waiting for the model) was still tried as an edit of the "thinking":
the request failed, the log said the reply failed, and only then did the answer go to the channel."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bot.app import Core
from bot.commands import CommandCall, SessionControl
from channels.discord import DiscordChannel
from tests.channels.discord.kit import running_bot
from tests.fakes.discord_server import INTERACTION_TOKEN_TTL, FakeDiscord
from tests.fakes.llm_server import FakeLLMServer


class Clock:
    """The monotonic clock of the bot's channel and of the fake Discord, moved on by the test."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("later", [INTERACTION_TOKEN_TTL + 1, INTERACTION_TOKEN_TTL - 30])
async def test_an_answer_past_the_token_goes_to_the_channel_without_a_failed_request(
    tmp_path: Path, later: float
) -> None:
    """Expired, or expiring within the minute (the edit and its follow-ups would outlive it)."""
    clock, started, release = Clock(), asyncio.Event(), asyncio.Event()

    async def slow(call: CommandCall, control: SessionControl) -> str:
        started.set()
        await release.wait()
        return "the slow answer"

    def add_slow(core: Core, channel: DiscordChannel) -> None:
        core.commands.add("slow", "answers when the test says so", slow)

    async with FakeLLMServer() as llm, FakeDiscord(clock=clock) as fake:
        alice, dm = fake.user("alice"), fake.dm_channel()
        section = {"allowed_users": [alice.id], "send_retries": 0}
        async with running_bot(fake, llm, tmp_path / "ws", section, before_start=add_slow, clock=clock):
            await fake.slash_command("slow", channel_id=dm, user=alice)
            await started.wait()  # (handed over once the "thinking" is up)
            clock.now += later
            release.set()
            [answer] = await fake.wait_for_bot_messages(dm)
        assert answer["content"] == "the slow answer"
        assert "interaction_token" not in answer  # posted in the channel, not as the interaction's
        assert [r.path for r in fake.requests if r.path.startswith("/webhooks/")] == []


async def test_an_answer_in_time_still_replaces_the_thinking(tmp_path: Path) -> None:
    clock = Clock()
    async with FakeLLMServer() as llm, FakeDiscord(clock=clock) as fake:
        alice, dm = fake.user("alice"), fake.dm_channel()
        async with running_bot(fake, llm, tmp_path / "ws", {"allowed_users": [alice.id]}, clock=clock):
            interaction = await fake.slash_command("help", channel_id=dm, user=alice)
            [answer] = await fake.wait_for_followups(interaction["token"])
        assert "Commands:" in answer["content"]
        assert [r.method for r in fake.requests if r.path.startswith("/webhooks/")] == ["PATCH"]
