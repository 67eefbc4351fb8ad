"""Shared set-up for the Telegram channel tests: the real PTB against the fake Bot API."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from bot.config import TelegramSettings
from bot.domain import InboundMessage, OutboundMessage
from bot.pairing import PAIRING_FILE, PairingStore
from bot.storage import append_line
from channels.telegram import TelegramChannel
from channels.telegram.journal import JOURNAL_FILE
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
        await self.wait_until(lambda: len(self.received) >= count, timeout)
        return list(self.received)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    async def changed(self) -> None:
        async with self._changed:
            self._changed.notify_all()


class DurableSink(RecordingSink):
    """The dispatcher's contract on real storage: ``submit`` returns once the message is appended and
    fsynced to ``inbox/telegram.jsonl``; when that write fails it raises, and nothing is kept."""

    def __init__(self, inbox: Path, reply: str | None = None) -> None:
        super().__init__(reply)
        self.inbox = inbox
        self.attempts = 0

    async def submit(self, message: InboundMessage) -> None:
        self.attempts += 1
        try:
            await asyncio.to_thread(append_line, self.inbox / "telegram.jsonl", message.text)
        finally:
            await self.changed()
        await super().submit(message)


async def all_taken_in(state_dir: Path, timeout: float = 10.0) -> None:
    """Wait until the channel's update journal in ``state_dir`` holds nothing: every update accepted so
    far was taken in and released. Call it once a later update is in (a sentinel): a message that reaches
    no sink (a stranger's, an ignored one) is decided then. A sentinel alone proves that only for its
    own chat, as chats are taken in side by side."""
    path = state_dir / JOURNAL_FILE
    async with asyncio.timeout(timeout):
        while json.loads(path.read_text())["held"]:
            await asyncio.sleep(0.01)


def break_folder(path: Path) -> Callable[[], None]:
    """A real storage fault that holds as root too: a plain file where the folder ``path`` should be,
    so every write below it fails with ENOTDIR. Returns the repair."""
    path.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    path.write_text("not a folder\n")

    def repair() -> None:
        path.unlink()
        aside.rename(path)

    return repair


def telegram_values(tg: FakeTelegramServer, **overrides: Any) -> dict[str, Any]:
    """The ``telegram`` settings for the fake: user 42 allowed, no join window, 1 s polls."""
    values: dict[str, Any] = {
        "token": tg.token,
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        "allowed_users": ["42"],
        "join_window": 0.0,
        "poll_timeout": 1,
    }
    values.update(overrides)
    return values


def settings_for(tg: FakeTelegramServer, **overrides: Any) -> TelegramSettings:
    return TelegramSettings(**telegram_values(tg, **overrides))


@contextlib.asynccontextmanager
async def running_channel(
    tg: FakeTelegramServer,
    workspace: Path,
    sink: RecordingSink | None = None,
    **overrides: Any,
) -> AsyncIterator[tuple[TelegramChannel, RecordingSink]]:
    """A started channel over the fake; ``vision``, ``max_inbound_chars``, ``chat_interval``,
    ``monotonic``, ``state_dir`` (default: ``workspace``), ``storage_retry_delay`` and
    ``storage_retry_max_delay`` go to the channel, everything else is a TelegramSettings field. Storage
    retries back off from 0.02 s to at most 0.2 s unless told."""
    sink = sink or RecordingSink()
    kwargs: dict[str, Any] = {
        "vision_supported": (lambda v: lambda: v)(overrides.pop("vision", False)),
        "max_inbound_chars": overrides.pop("max_inbound_chars", 16000),
        "chat_interval": overrides.pop("chat_interval", 0.01),
        "state_dir": overrides.pop("state_dir", workspace),
        "storage_retry_delay": overrides.pop("storage_retry_delay", 0.02),
        "storage_retry_max_delay": overrides.pop("storage_retry_max_delay", 0.2),
    }
    if "monotonic" in overrides:
        kwargs["monotonic"] = overrides.pop("monotonic")
    channel = TelegramChannel(
        settings_for(tg, **overrides),
        sink.submit,
        pairing=PairingStore(workspace / PAIRING_FILE),
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
