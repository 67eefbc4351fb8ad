"""What the dispatcher benchmarks share: a recording channel, settings against a model server, figures.

The bot under test is the real one (``bot.app.build_core``: dispatcher, durable inbox, pipeline,
sessions, memory); only the channel is a bench channel, which records every reply with the time it
arrived, and the model is a server on 127.0.0.1 (see instant_llm.py) reached by the real LLM client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from bot.config import Settings, load_settings
from bot.domain import OutboundMessage, Usage
from bot.llm.types import ChatRequest, ChatResponse, StreamEvent
from channels.base import Channel

ANTHROPIC_MODEL = "claude-haiku-4-5"


@dataclass(frozen=True, slots=True)
class Reply:
    message: OutboundMessage
    at: float  # time.perf_counter() when the channel was handed the reply
    queued_after: int  # messages of that chat still waiting for a turn when the reply went out


class BenchChannel(Channel):
    """Records replies (with arrival time) and wakes whoever waits for one chat's next reply.

    ``queue_depth`` (the dispatcher's, by session id) tells, with each reply, whether messages of that
    chat still wait for a turn: a reply with nothing queued after it answers the chat's last message.
    """

    name: ClassVar[str] = "bench"

    def __init__(self, submit: Any, queue_depth: Callable[[str], int] = lambda sid: 0) -> None:
        super().__init__(submit)
        self._depth = queue_depth
        self.replies: list[Reply] = []
        self._waiting: dict[str, asyncio.Queue[Reply]] = {}
        self.arrived: asyncio.Queue[Reply] = asyncio.Queue()  # every reply, to whichever chat

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, message: OutboundMessage) -> None:
        reply = Reply(message, time.perf_counter(), self._depth(f"{self.name}:{message.chat_id}"))
        self.replies.append(reply)
        self.inbox(message.chat_id).put_nowait(reply)
        self.arrived.put_nowait(reply)

    def inbox(self, chat_id: str) -> asyncio.Queue[Reply]:
        """The replies to ``chat_id`` not yet taken, in order."""
        queue = self._waiting.get(chat_id)
        if queue is None:
            queue = self._waiting[chat_id] = asyncio.Queue()
        return queue


def bench_settings(
    workspace: Path, *, memory: bool, provider: str = "openai", base_url: str | None = None, **extra: Any
) -> Settings:
    """Settings for one run: a fresh workspace, the model server at ``base_url`` (or none), memory on/off.

    Without ``base_url`` an API key is set only so start-up's configuration check passes (the in-process
    model is injected instead). ``extra`` adds top-level overrides (e.g. ``dispatcher``).
    """
    llm: dict[str, Any]
    if provider == "anthropic":
        llm = {"model": ANTHROPIC_MODEL, "anthropic": {"api_key": "sk-ant-bench", "base_url": base_url}}
    else:
        llm = {"openai": {"api_key": "sk-bench-not-used", "base_url": base_url}}
    return load_settings(
        env_file=None,
        overrides={"workspace": workspace, "llm": llm, "memory": {"enabled": memory}, **extra},
    )


def percentile(values: list[float], share: float) -> float:
    """The value below which ``share`` of ``values`` lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def cpu_seconds() -> float:
    """CPU time of this process, every thread included (the bot's, not the model server's)."""
    return time.process_time()


class InstantModel:
    """Answers every request at once with a short reply (the zero-latency LLM, in process)."""

    async def chat(self, request: ChatRequest) -> ChatResponse:
        return ChatResponse(content="ok, noted.", usage=Usage(input_tokens=10, output_tokens=3, calls=1))

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        response = await self.chat(request)
        yield StreamEvent("text", text=response.content)
        yield StreamEvent("done", response=response)
