"""Discord on a disk that cannot be written: Discord never delivers a message again, so the channel
keeps submitting it (with backoff, in order) until storage takes it, instead of losing it.

The fault is real (a file where the dispatcher side's inbox folder should be); the dispatcher side is
the Telegram kit's ``DurableSink``, which fsyncs each message before ``submit`` returns.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import DiscordSettings
from channels.discord import DiscordChannel
from tests.channels.telegram.kit import DurableSink, break_folder
from tests.fakes.discord_server import FakeDiscord


async def test_a_message_the_dispatcher_cannot_store_is_retried_until_it_can_never_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = DurableSink(tmp_path / "inbox")
    async with FakeDiscord() as fake:
        alice, dm = fake.user("alice"), fake.dm_channel()
        settings = DiscordSettings(
            token=fake.token,
            api_base=fake.api_base,
            gateway_url=fake.gateway_url,
            allowed_users=[alice.id],
            sync_commands=False,
        )
        channel = DiscordChannel(
            settings,
            sink.submit,
            pairing=None,
            commands=[],
            vision_supported=lambda: False,
            state_dir=tmp_path / "state",
            guild_ready_timeout=0.05,
            storage_retry_delay=0.02,
            storage_retry_max_delay=0.2,
        )
        await channel.start()
        try:
            repair = break_folder(tmp_path / "inbox")
            await fake.user_message(channel_id=dm, author=alice, content="kept")
            await fake.user_message(channel_id=dm, author=alice, content="kept too")
            await sink.wait_until(lambda: sink.attempts >= 6)  # more tries than any fixed limit would give
            assert sink.received == []
            repair()
            await sink.wait_for(2)
        finally:
            await channel.stop()
    assert [m.text for m in sink.received] == ["kept", "kept too"]  # in order, once each
    outages = [
        r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg["event"] == "storage_unavailable"
    ]
    assert [o["what"] for o in outages] == ["taking Discord messages in"]
