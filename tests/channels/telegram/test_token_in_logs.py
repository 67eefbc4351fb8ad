"""The bot token is in every Bot API URL: whatever the Telegram channel logs of a failure never shows it."""

from __future__ import annotations

import asyncio
import io
import logging
from pathlib import Path

from bot.logging import configure_logging
from tests.channels.telegram.kit import RecordingSink, running_channel
from tests.fakes.telegram_server import FakeTelegramServer


async def test_failures_that_quote_the_token_reach_the_log_without_it(tmp_path: Path) -> None:
    """A Bot API front (a proxy, a self-hosted server) that names the request path in its errors puts the
    token in PTB's exception text, which the channel logs (polling, sending); so does a token revoked
    while the bot runs. Logged at DEBUG, with the libraries' own lines, as ``membot run`` sets it up."""
    buf = io.StringIO()
    async with FakeTelegramServer() as tg:
        secret = tg.token.split(":")[1]
        configure_logging(level="DEBUG", fmt="json", secrets=[tg.token], stream=buf)  # (Settings.secrets)
        try:
            tg.fail("getUpdates", 502, f"Bad Gateway: upstream failed for /bot{tg.token}/getUpdates")
            tg.fail("sendMessage", 400, f"Bad Request: /bot{tg.token}/sendMessage refused", times=10)
            async with running_channel(tg, tmp_path, RecordingSink(reply="hello")) as (channel, sink):
                tg.push_message("hi")
                await sink.wait_for(1)
                async with asyncio.timeout(10):
                    while "telegram_send_failed" not in buf.getvalue():
                        await asyncio.sleep(0.02)
                tg.token = "123456789:AAAnotherTokenAnotherTokenAnother00"  # revoked at @BotFather
                async with asyncio.timeout(10):
                    while channel.health.state != "failed":
                        await asyncio.sleep(0.02)
        finally:
            configure_logging(level="DEBUG", fmt="json")  # as tests/conftest.py has it
            logging.getLogger("markdown_it").setLevel(logging.INFO)
    out = buf.getvalue()
    for event in ("telegram_polling_failed", "telegram_send_failed", "telegram_polling_stopped"):
        assert event in out  # the failures were logged, with what Telegram said...
    assert "/bot***/getupdates" in out.lower() and "/bot***/sendmessage" in out.lower()
    assert secret not in out  # ...but never the token
