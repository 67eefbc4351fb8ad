"""Honest test doubles of our own interfaces (they implement them fully; nothing is patched)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from bot.domain import OutboundMessage
from bot.tools import ToolContext
from channels.base import Channel, InboundSink, PartialSink


class RecordingChannel(Channel):
    """A channel that records every reply it is asked to send."""

    name: ClassVar[str] = "test"

    def __init__(self, submit: InboundSink, name: str = "test") -> None:
        super().__init__(submit)
        self.name = name  # type: ignore[misc]
        self.sent: list[OutboundMessage] = []
        self._arrived = asyncio.Condition()

    async def start(self) -> None:
        self.health.state = "running"

    async def stop(self) -> None:
        self.health.state = "stopped"

    async def send(self, message: OutboundMessage) -> None:
        async with self._arrived:
            self.sent.append(message)
            self._arrived.notify_all()

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[OutboundMessage]:
        """Wait until at least ``count`` replies were sent."""
        async with asyncio.timeout(timeout), self._arrived:
            await self._arrived.wait_for(lambda: len(self.sent) >= count)
        return list(self.sent)


class StreamingChannel(RecordingChannel):
    """A recording channel that also shows answers as they stream, as Telegram and Discord can: each
    preview (the text of the model call so far) is recorded in ``previews``."""

    def __init__(self, submit: InboundSink, name: str = "test") -> None:
        super().__init__(submit, name)
        self.previews: list[str] = []

    def partial_sink(self, chat_id: str, reply_to: str | None = None) -> PartialSink | None:
        async def show(text_so_far: str) -> None:
            self.previews.append(text_so_far)

        return show


class SlowTool:
    """A tool that runs until it is cancelled, and records that it started and that the cancel reached it."""

    name = "slow"
    description = "Takes forever."
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return "never"
