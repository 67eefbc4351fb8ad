"""Webhook mode: the secret is checked on every request and an update is acknowledged once stored."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from bot.errors import ConfigError
from tests.channels.telegram.kit import break_folder, running_channel
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
        assert [m.text for m in await sink.wait_for(1)] == ["right"]


async def test_an_update_that_could_not_be_stored_is_not_acknowledged(tmp_path: Path) -> None:
    port = await asyncio.to_thread(free_port)
    state = tmp_path / "state"
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, state_dir=state, **webhook_settings(port)) as (_, sink),
    ):
        repair = break_folder(state)  # a real write failure, as on a full disk
        update = {"update_id": 7, "message": tg.user_message("important")}
        assert await tg.post_webhook(update, secret=SECRET) == 503  # Telegram will deliver it again
        assert await tg.post_webhook(update, secret=SECRET) == 503
        repair()
        assert await tg.post_webhook(update, secret=SECRET) == 200
        assert [m.text for m in await sink.wait_for(1)] == ["important"]


async def test_an_update_delivered_again_is_acknowledged_but_taken_once(tmp_path: Path) -> None:
    port = await asyncio.to_thread(free_port)
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, **webhook_settings(port)) as (_, sink),
    ):
        update = {"update_id": 7, "message": tg.user_message("once")}
        assert await tg.post_webhook(update, secret=SECRET) == 200
        await sink.wait_for(1)
        # Telegram sends it again when our 200 got lost on the way; the answer must still be 200.
        assert await tg.post_webhook(update, secret=SECRET) == 200
        assert await tg.post_webhook({"message": tg.user_message("sentinel")}, secret=SECRET) == 200
        received = await sink.wait_for(2)
    assert [m.text for m in received] == ["once", "sentinel"]


async def test_webhook_mode_needs_url_and_secret(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg:
        with pytest.raises(ConfigError, match="webhook_secret"):
            async with running_channel(tg, tmp_path, mode="webhook", webhook_url="https://example.com/hook"):
                pass


async def test_polling_that_removes_a_webhook_left_set_says_so_and_keeps_its_updates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A webhook still set (another membot in webhook mode, or one switched to polling) was removed
    without a word: the other process stopped getting messages and nothing said why."""
    async with FakeTelegramServer() as tg:
        tg.webhook = {"url": "https://bot.example.org/telegram/hook", "secret_token": SECRET}
        tg.push_message("sent while the webhook was set")
        async with running_channel(tg, tmp_path) as (_, sink):
            assert [m.text for m in await sink.wait_for(1)] == ["sent while the webhook was set"]
    assert tg.webhook is None
    [removed] = [
        r.msg
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg["event"] == "telegram_webhook_removed"
    ]
    assert removed["host"] == "bot.example.org" and "webhook mode" in str(removed["fix"])
