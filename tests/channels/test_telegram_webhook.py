"""Webhook mode: the secret is checked on every request and an update is acknowledged once queued."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from bot.domain import InboundMessage
from bot.errors import ConfigError
from tests.channels.telegram_kit import RecordingSink, running_channel
from tests.fakes.telegram_server import FakeTelegramServer

SECRET = "s3cret-token_for-tests"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def webhook_settings(port: int) -> dict[str, object]:
    return {
        "mode": "webhook",
        "webhook_listen": "127.0.0.1",
        "webhook_port": port,
        "webhook_url": f"http://127.0.0.1:{port}/telegram/hook",
        "webhook_secret": SECRET,
    }


async def test_webhook_accepts_the_right_secret_and_refuses_others(tmp_path: Path) -> None:
    port = await asyncio.to_thread(free_port)
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, **webhook_settings(port)) as (_, sink),
    ):
        assert tg.webhook == {"url": f"http://127.0.0.1:{port}/telegram/hook", "secret_token": SECRET}
        assert tg.calls_to("getUpdates") == []  # no polling in webhook mode

        assert await tg.post_webhook({"message": tg.user_message("wrong")}, secret="guess") == 403
        assert await tg.post_webhook({"message": tg.user_message("none")}, secret=None) == 403
        assert sink.received == []

        assert await tg.post_webhook({"message": tg.user_message("right")}, secret=SECRET) == 200
        # Acknowledged only after submit() returned: the message is already there.
        assert [m.text for m in sink.received] == ["right"]


class FailingSink(RecordingSink):
    """A dispatcher that cannot queue the first message (as when the disk is full), then recovers."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 1

    async def submit(self, message: InboundMessage) -> None:
        if self.failures:
            self.failures -= 1
            raise OSError("disk full")
        await super().submit(message)


async def test_an_update_that_was_not_queued_is_not_acknowledged(tmp_path: Path) -> None:
    port = await asyncio.to_thread(free_port)
    sink = FailingSink()
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, sink, **webhook_settings(port)) as _:
        update = {"message": tg.user_message("important")}
        assert await tg.post_webhook(update, secret=SECRET) == 500  # Telegram will deliver it again
        assert await tg.post_webhook(update, secret=SECRET) == 200
        assert [m.text for m in sink.received] == ["important"]


async def test_webhook_mode_needs_url_and_secret(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg:
        with pytest.raises(ConfigError, match="webhook_secret"):
            async with running_channel(tg, tmp_path, mode="webhook", webhook_url="https://example.com/hook"):
                pass
