"""The core's contract with the channel adapters, owned by the core so that layers point one way.

``bot`` and ``pipeline`` never import ``channels``: the dispatcher and the service runner are written
against :class:`ChannelPort`, and only the composition root (``bot/app.py``) builds concrete channels.
``channels.base.Channel`` implements this contract and re-exports its values for the adapters.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

from bot.domain import InboundMessage, OutboundMessage

__all__ = ["ChannelHealth", "ChannelPort", "ChannelState", "InboundSink", "PartialSink"]

InboundSink = Callable[[InboundMessage], Awaitable[None]]
"""How a channel hands a message to the core (``Dispatcher.submit``); awaited, it is safely queued."""

PartialSink = Callable[[str], Awaitable[None]]
"""Receives the partial reply text while the model writes (streaming)."""

ChannelState = Literal["stopped", "starting", "running", "degraded", "failed"]


@dataclass(slots=True)
class ChannelHealth:
    """What /healthz and /status report about a channel. ``storage_errors``: the writes the channel
    cannot make now (a full disk, a read-only workspace), by what they are for, each with its error;
    it takes no message in meanwhile (they wait on the platform, or in its retries)."""

    state: ChannelState = "stopped"
    last_inbound: datetime | None = None
    error: str | None = None
    sent: int = 0
    send_failures: int = 0
    extra: dict[str, str] = field(default_factory=dict)
    storage_errors: dict[str, str] = field(default_factory=dict)


class ChannelPort(Protocol):
    """A channel as the core sees it: the dispatcher replies through it, the service runner starts and
    stops it and reads its health.

    ``start`` returns once the channel is receiving; ``send`` must not lose a reply silently.
    ``activity`` is shown while a turn runs (a typing indicator) and ``partial_sink``, if not ``None``,
    receives the reply as it is written.
    """

    @property
    def name(self) -> str: ...

    @property
    def health(self) -> ChannelHealth: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, message: OutboundMessage) -> None: ...

    def activity(self, chat_id: str) -> AbstractAsyncContextManager[None]: ...

    def partial_sink(self, chat_id: str, reply_to: str | None = None) -> PartialSink | None: ...
