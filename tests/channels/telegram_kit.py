"""Shared set-up for the Telegram channel tests: the real PTB against the fake Bot API."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bot.config import TelegramSettings
from bot.domain import InboundMessage, OutboundMessage
from bot.pairing import PAIRING_FILE, PairingStore
from channels.telegram import TelegramChannel
from tests.fakes.telegram_server import FakeTelegramServer

COMMANDS = [
    ("status", "Show status"),
    ("compact", "Compact the conversation"),
    ("new", "Start a new session"),
    ("stop", "Stop the running reply"),
    ("help", "Show the commands"),
]


class RecordingSink:
    """The dispatcher side of the channel contract, implemented honestly: it records what is
    submitted and, if told to, answers through the channel the way the dispatcher does."""

    def __init__(self, reply: str | None = None) -> None:
        self.received: list[InboundMessage] = []
        self.channel: TelegramChannel | None = None
        self.reply = reply
        self._changed = asyncio.Condition()

    async def submit(self, message: InboundMessage) -> None:
        async with self._changed:
            self.received.append(message)
            self._changed.notify_all()
        if self.reply is not None and self.channel is not None:
            out = OutboundMessage(message.channel, message.chat_id, self.reply, reply_to=message.message_id)
            await self.channel.send(out)

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[InboundMessage]:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: len(self.received) >= count)
        return list(self.received)


def settings_for(tg: FakeTelegramServer, **overrides: Any) -> TelegramSettings:
    values: dict[str, Any] = {
        "token": tg.token,
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        "allowed_users": ["42"],
        "join_window": 0.0,
        "poll_timeout": 1,
    }
    values.update(overrides)
    return TelegramSettings(**values)


@contextlib.asynccontextmanager
async def running_channel(
    tg: FakeTelegramServer,
    workspace: Path,
    sink: RecordingSink | None = None,
    **overrides: Any,
) -> AsyncIterator[tuple[TelegramChannel, RecordingSink]]:
    """A started channel over the fake; ``vision``, ``max_inbound_chars``, ``chat_interval`` and
    ``monotonic`` go to the channel, everything else is a TelegramSettings field."""
    sink = sink or RecordingSink()
    kwargs: dict[str, Any] = {
        "vision_supported": (lambda v: lambda: v)(overrides.pop("vision", False)),
        "max_inbound_chars": overrides.pop("max_inbound_chars", 16000),
        "chat_interval": overrides.pop("chat_interval", 0.01),
    }
    if "monotonic" in overrides:
        kwargs["monotonic"] = overrides.pop("monotonic")
    channel = TelegramChannel(
        settings_for(tg, **overrides),
        sink.submit,
        pairing=PairingStore(workspace / PAIRING_FILE),
        state_dir=workspace,
        commands=COMMANDS,
        retry_base_delay=0.01,
        typing_interval=0.05,
        stream_interval=0.0,
        **kwargs,
    )
    sink.channel = channel
    await channel.start()
    try:
        yield channel, sink
    finally:
        await channel.stop()
