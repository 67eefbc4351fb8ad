"""One chat with a bot built by ``bot.app.build_core``, over a recording channel: the end-to-end tests'
way to talk to the real dispatcher and pipeline (the fake model server records what reached the model)."""

from __future__ import annotations

from datetime import datetime

from bot.app import Core
from bot.domain import InboundMessage
from tests.recording import RecordingChannel


class Chat:
    """A private chat ``c1`` with user ``u1``; each message gets the next id."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.channel = RecordingChannel(core.dispatcher.submit)
        core.dispatcher.attach(self.channel)
        self._ids = 0

    async def say(self, text: str, *, at: datetime | None = None) -> str:
        """Send ``text`` (as sent at ``at``, by default now) and return the reply to it."""
        self._ids += 1
        count = len(self.channel.sent)
        extra = {"timestamp": at} if at is not None else {}
        message = InboundMessage("test", "c1", "u1", text, message_id=str(self._ids), **extra)
        await self.core.dispatcher.submit(message)
        return (await self.channel.wait_for(count + 1, timeout=30))[count].text
