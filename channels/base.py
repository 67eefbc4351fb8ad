"""What every channel adapter shares: the base class that implements the core's contract
(:class:`bot.ports.ChannelPort`, whose values are re-exported here) and the access rules.

A channel turns platform events into :class:`~bot.domain.InboundMessage` values and hands them to the
dispatcher through ``submit`` (awaiting it means the message is safely queued, so only then may the
platform be told it was received). Replies come back through ``send``. Platform libraries are imported
only inside the adapter modules, never here.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Coroutine, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar

from bot.domain import InboundMessage, OutboundMessage, utcnow
from bot.ports import ChannelHealth, ChannelState, InboundSink, PartialSink

__all__ = [
    "Allowlist",
    "Channel",
    "ChannelHealth",
    "ChannelState",
    "InboundSink",
    "PartialSink",
    "quote_reply",
    "while_running",
]

QUOTE_CHARS = 500  # of a replied-to message shown with the reply


def quote_reply(who: str, text: str) -> str:
    """The message a user replies to, as the model sees it before the reply ("" when it says nothing):
    "is this true?" means nothing without it."""
    said = " ".join(text.split())
    if not said:
        return ""
    if len(said) > QUOTE_CHARS:
        said = said[:QUOTE_CHARS] + "…"
    return f'[replying to {who}: "{said}"]'


class Allowlist:
    """Deny-by-default set of ids. Empty admits nobody; ``"*"`` admits everyone, deliberately.

    Ids are compared as exact strings, so ``"12"`` never admits ``"123"``.
    """

    def __init__(self, ids: Iterable[str | int] = ()) -> None:
        self._ids = frozenset(str(i).strip() for i in ids if str(i).strip())

    @property
    def is_open(self) -> bool:
        return "*" in self._ids

    def allows(self, id_: str | int | None) -> bool:
        if self.is_open:
            return True
        return id_ is not None and str(id_) in self._ids


class Channel(ABC):
    """Base class of the Telegram, Discord and terminal adapters; implements :class:`bot.ports.ChannelPort`.

    Subclasses set ``name`` and implement ``start``, ``stop`` and ``send``. They may override
    ``activity`` (a typing indicator shown while a turn runs) and ``partial_sink`` (streaming partial
    output). ``start`` must return once the channel is receiving; its background work belongs to tasks
    it owns and cancels in ``stop``.
    """

    name: ClassVar[str]

    def __init__(self, submit: InboundSink) -> None:
        self._submit = submit
        self.health = ChannelHealth()

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    @abstractmethod
    async def send(self, message: OutboundMessage) -> None:
        """Deliver a reply. Must not lose it silently: retry what can be retried, log what finally fails."""

    def activity(self, chat_id: str) -> AbstractAsyncContextManager[None]:
        """Shown while a turn for ``chat_id`` runs (a typing indicator). Default: nothing."""
        return contextlib.nullcontext()

    def partial_sink(self, chat_id: str, reply_to: str | None = None) -> PartialSink | None:
        """A callback that receives the partial reply text while the model writes, if streaming is on.
        ``reply_to``: the message being answered (a platform that threads replies refers to it)."""
        return None

    async def handle_inbound(self, message: InboundMessage) -> None:
        """Hand a normalized, already-authorized message to the dispatcher."""
        self.health.last_inbound = utcnow()
        await self._submit(message)


@contextlib.asynccontextmanager
async def while_running(work: Coroutine[Any, Any, None], *, name: str) -> AsyncIterator[None]:
    """Run ``work`` (a typing indicator, say) for as long as the block lasts, then cancel it cleanly."""
    task = asyncio.create_task(work, name=name)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
