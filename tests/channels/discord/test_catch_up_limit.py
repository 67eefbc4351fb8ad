"""End to end: a chat that missed more than ``discord.catch_up_max_messages`` gets its newest answered.

The newest messages are the ones people still wait for; the oldest of a long backlog are stale. So past
the limit the catch-up (channels/discord/catch_up.py) takes in the newest ``limit``, oldest first among
them, skips the older ones, says how many in the log, and moves the mark past all of it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.storage import atomic_write_text_async
from channels.discord.seen import SEEN_FILE
from tests.channels.discord.test_catch_up import events, offline
from tests.fakes.discord_server import snowflake


async def test_past_the_limit_the_newest_are_answered_in_order_and_the_older_skipped_for_good(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with offline(tmp_path) as o:
        async with o.run(catch_up_max_messages=3):
            await o.dm_from_alice("hello")
            await o.discord.wait_for_bot_messages(o.dm, 1)
        missed = [await o.dm_from_alice(f"while down {n}") for n in range(1, 6)]
        async with o.run(catch_up_max_messages=3):
            await o.discord.wait_until(lambda: "while down 5" in "".join(o.discord.bot_texts(o.dm)))
        caught_up = o.discord.bot_texts(o.dm)[1:]  # (messages queued behind a turn share the next one)
        said = "\n".join(caught_up)
        assert said.index("while down 3") < said.index("while down 4") < said.index("while down 5")
        assert "while down 1" not in said and "while down 2" not in said
        assert all("while down 2" not in json.dumps(r.body) for r in o.llm.requests)
        replied = {str(m["message_reference"]["message_id"]) for m in o.discord.bot_messages[1:]}
        assert replied <= {m["id"] for m in missed[2:]}
        marks = o.workspace / "state" / SEEN_FILE
        assert int(json.loads(marks.read_text())["newest"][o.dm]) >= int(missed[-1]["id"])
        asked = len(o.llm.requests)
        async with o.run(catch_up_max_messages=3):  # nothing of it is read again
            await o.dm_from_alice("live")
            await o.discord.wait_for_bot_messages(o.dm, 2 + len(caught_up))
        assert o.discord.bot_texts(o.dm) == ["echo: hello", *caught_up, "echo: live"]
        assert len(o.llm.requests) == asked + 1
    [reached] = events(caplog, "discord_catch_up_limit_reached")  # the third session skipped nothing
    assert reached["chat_id"] == o.dm and reached["read"] == 3
    assert reached["skipped"] == 3 and reached["at_least"] is False  # the answer to hello, 1 and 2
    assert "discord.catch_up_max_messages" in reached["hint"]
    second, third = [e for e in events(caplog, "discord_caught_up") if e["chat_id"] == o.dm]
    assert (second["handed_over"], second["skipped"]) == (3, 3)
    assert third["skipped"] == 0 and third["read"] <= len(caught_up) + 1  # the answers, maybe "live"


async def test_past_the_limit_and_the_max_age_the_newest_of_the_last_day_are_answered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = datetime.now(UTC)
    async with offline(tmp_path) as o:
        seen = {"newest": {o.dm: snowflake(now - timedelta(days=6))}}  # the bot last saw the chat then
        await atomic_write_text_async(o.workspace / "state" / SEEN_FILE, json.dumps(seen))
        for days in (4, 3, 2):  # more too-old messages than the limit reads
            await o.dm_from_alice(f"{days} days ago", at=now - timedelta(days=days))
        for hours in (4, 3, 2, 1):
            await o.dm_from_alice(f"{hours} hours ago", at=now - timedelta(hours=hours))
        async with o.run(catch_up_max_messages=2):
            await o.discord.wait_until(lambda: "1 hours ago" in "".join(o.discord.bot_texts(o.dm)))
        said = "\n".join(o.discord.bot_texts(o.dm))
        assert said.startswith("echo: 2 hours ago") and said.index("2 hours") < said.index("1 hours")
        assert not any(skipped in said for skipped in ("days ago", "4 hours", "3 hours"))
    [too_old] = events(caplog, "discord_catch_up_too_old")
    assert too_old["skipped"] == 3 and too_old["at_least"] is True  # the read stopped at limit + 1
    [reached] = events(caplog, "discord_catch_up_limit_reached")
    assert reached["skipped"] == 1 and reached["at_least"] is True  # "3 hours ago" seen, "4" not


@pytest.mark.parametrize("later", [timedelta(0), timedelta(minutes=5)], ids=["in-the-margin", "past-it"])
async def test_what_arrives_live_while_the_chat_waits_for_its_read_does_not_count_against_the_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, later: timedelta
) -> None:
    """Messages written after the session started come live, behind the chat's gate. Were they read with
    the history, a busy chat whose read comes late would push what it missed out of the newest, and the
    live messages pushed out with it would be answered after the newer ones. Those of the minute after
    the start (the margin for the host's clock) are read too: the read takes them besides the limit."""
    async with offline(tmp_path) as o:
        async with o.run(catch_up_max_messages=3):
            await o.dm_from_alice("hello")
            await o.discord.wait_for_bot_messages(o.dm, 1)
        for n in (1, 2):
            await o.dm_from_alice(f"missed {n}")
        o.discord.rate_limit("GET", f"/channels/{o.dm}/messages", retry_after=0.5)  # a read that comes late
        async with o.run(catch_up_max_messages=3):
            now = datetime.now(UTC) + later
            for n in range(1, 5):
                await o.dm_from_alice(f"live {n}", at=now + timedelta(milliseconds=n))
            await o.discord.wait_until(lambda: "live 4" in "".join(o.discord.bot_texts(o.dm)))
        said = "\n".join(o.discord.bot_texts(o.dm)[1:])
        order = ["missed 1", "missed 2", "live 1", "live 2", "live 3", "live 4"]
        found = [said.find(text) for text in order]
        assert -1 not in found and found == sorted(found), said
    assert not events(caplog, "discord_catch_up_limit_reached")
