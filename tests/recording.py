"""Honest test doubles of our own interfaces (they implement them fully; nothing is patched)."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from bot.domain import OutboundMessage
from channels.base import Channel, InboundSink


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
