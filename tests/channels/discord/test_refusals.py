"""Channels Discord refuses for good (the user's DMs are closed to the bot, the channel is gone, the bot
lost access or a permission), end to end: the fake with Discord's own error bodies → real discord.py →
DiscordChannel → the real core.

Such an answer used to be sent again with growing pauses for an hour while the chat's later answers
waited behind it. Now it is set aside at once (kept in the inbox, logged with what to do), and the
chat's later answers are each tried once. Rate limits and 5xx stay temporary: sent again, not set aside.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bot.domain import OutboundMessage
from bot.errors import ChannelError, ChannelRefused
from tests.channels.discord.test_channel import World, discord_world
from tests.fakes.discord_server import (
    CANNOT_DM,
    MISSING_ACCESS,
    MISSING_PERMISSIONS,
    UNKNOWN_CHANNEL,
)
from tests.fakes.llm_wire import FakeReply


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


def levels(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.levelname for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


def posts(w: World, channel_id: str) -> list[str]:
    path = f"/channels/{channel_id}/messages"
    return [
        str((r.body or {}).get("content"))
        for r in w.discord.requests
        if r.method == "POST" and r.path == path
    ]


async def test_an_answer_to_a_user_who_closed_their_dms_is_set_aside_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It was sent again for an hour, its chat's later answers waiting behind it."""
    async with discord_world(tmp_path) as w:
        sid = f"discord:{w.dm}"
        w.discord.refuse_channel(w.dm)  # 50007: Alice no longer accepts the bot's DMs
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="first")
        await w.discord.user_message(channel_id=w.quiet, author=w.alice, content="hello", guild=w.guild)
        [other] = await w.discord.wait_for_bot_messages(w.quiet)
        async with asyncio.timeout(5):
            await w.core.dispatcher.settled(sid)
        assert other["content"] == "echo: alice: hello"  # a guild channel: the model hears who speaks
        assert posts(w, w.dm) == ["echo: first"]  # once: no retry storm
        [refused] = logged(caplog, "reply_refused")
        assert refused["chat_id"] == w.dm and "does not let the bot message this user" in str(
            refused["reason"]
        )
        assert "allow direct messages" in str(refused["fix"]) and "50007" in str(refused["error"])
        # The user's own setting, nothing the operator could fix: warnings, not errors.
        assert levels(caplog, "reply_refused") == ["WARNING"]
        assert levels(caplog, "discord_send_refused_by_user") == ["WARNING"]
        assert not levels(caplog, "discord_send_failed")
        assert [r.text for r in w.core.inbox.kept_replies(sid)] == ["echo: first"]

        # A later answer in the same chat is tried once too (after the one set aside), not held.
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="second")
        await w.discord.wait_until(lambda: len(posts(w, w.dm)) == 3)
        async with asyncio.timeout(5):
            await w.core.dispatcher.settled(sid)
        assert posts(w, w.dm) == ["echo: first", "echo: first", "echo: second"]

        # DMs open again: the next answer brings the ones set aside first, in order.
        w.discord.allow_channel(w.dm)
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="third")
        await w.discord.wait_for_bot_messages(w.dm, 3)
        async with asyncio.timeout(5):
            await w.core.dispatcher.settled(sid)
        assert w.discord.bot_texts(w.dm) == ["echo: first", "echo: second", "echo: third"]
        assert w.core.inbox.kept_replies(sid) == []


async def test_a_streamed_answer_stops_trying_a_channel_that_refused_its_first_preview(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As on Telegram, one refused preview ends the previews of the turn; the answer takes the refused path."""
    async with discord_world(
        tmp_path, discord_settings={"streaming": True, "stream_edit_interval": 0.2}
    ) as w:
        sid = f"discord:{w.dm}"
        w.discord.refuse_channel(w.dm)
        w.llm.script(FakeReply(text="The answer, streamed in three parts, is forty-two."))
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="stream please")
        async with asyncio.timeout(5):
            while not logged(caplog, "reply_set_aside"):
                await asyncio.sleep(0.01)
            await w.core.dispatcher.settled(sid)
        [preview, final] = posts(w, w.dm)
        assert final == "The answer, streamed in three parts, is forty-two."
        assert preview.endswith(" …") and final.startswith(preview.removesuffix(" …"))
        assert len(logged(caplog, "discord_stream_failed")) == 1
        assert [r.text for r in w.core.inbox.kept_replies(sid)] == [final]


@pytest.mark.parametrize(
    ("refusal", "reason"),
    [
        (CANNOT_DM, "Discord does not let the bot message this user"),
        (UNKNOWN_CHANNEL, "the channel was deleted"),
        (MISSING_ACCESS, "the bot cannot see the channel"),
        (MISSING_PERMISSIONS, "the bot lacks a permission in the channel"),
    ],
    ids=["50007", "10003", "50001", "50013"],
)
async def test_a_channel_refused_for_good_is_a_channel_refusal_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, refusal: tuple[int, int, str], reason: str
) -> None:
    async with discord_world(tmp_path) as w:
        w.discord.refuse_channel(w.general, refusal)
        with pytest.raises(ChannelRefused, match=w.general) as raised:
            await w.channel.send(OutboundMessage("discord", w.general, "anyone there?"))
        assert raised.value.reason.startswith(reason)
        assert len(posts(w, w.general)) == 1  # the channel does not retry it either
        # Closed DMs are the user's choice (a warning); the others need the operator (an error).
        by_user = refusal == CANNOT_DM
        assert raised.value.by_user is by_user
        assert levels(caplog, "discord_send_refused_by_user") == (["WARNING"] if by_user else [])
        assert levels(caplog, "discord_send_failed") == ([] if by_user else ["ERROR"])


@pytest.mark.parametrize("fault", ["rate-limited", "5xx"])
async def test_rate_limits_and_server_errors_stay_temporary(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    """Past the library's and the channel's retries they are sent again by the dispatcher, not set aside."""
    settings: dict[str, Any] = {"send_retries": 0}
    async with discord_world(tmp_path, discord_settings=settings) as w:
        path = f"/channels/{w.dm}/messages"
        if fault == "rate-limited":
            w.discord.rate_limit("POST", path, times=5, retry_after=0.01)  # discord.py gives up after 5
        else:
            w.discord.fail("POST", path, status=503)
        with pytest.raises(ChannelError) as raised:
            await w.channel.send(OutboundMessage("discord", w.dm, "direct"))
        assert not isinstance(raised.value, ChannelRefused)

        if fault == "rate-limited":
            w.discord.rate_limit("POST", path, times=5, retry_after=0.01)
        else:
            w.discord.fail("POST", path, status=503)
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="hello")
        [reply] = await w.discord.wait_for_bot_messages(w.dm)
        async with asyncio.timeout(5):
            await w.core.dispatcher.settled(f"discord:{w.dm}")
        assert reply["content"] == "echo: hello"
        assert logged(caplog, "reply_sent_late") and not logged(caplog, "reply_refused")
