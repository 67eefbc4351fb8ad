"""Per-message overhead of dispatcher + pipeline + persistence, as a session grows.

The model answers instantly (an in-process stand-in for the LLM client: no HTTP, no encoding of the
request), so what is timed is membot's own work per message: intake (durable inbox), the session lane,
every pipeline system, saving the session, and handing the reply to the channel.

    python bench/overhead.py [--turns 200] [--sizes 10,1000,10000] [--memory]

Prints median and p99 per size and the ratio of the largest to the smallest median.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

from bot.app import build_core
from bot.config import load_settings
from bot.domain import InboundMessage, Message, OutboundMessage, Role, Usage
from bot.llm.types import ChatRequest, ChatResponse, StreamEvent
from bot.logging import configure_logging
from channels.base import Channel


class InstantModel:
    """Answers every request at once with a short reply (the zero-latency LLM)."""

    async def chat(self, request: ChatRequest) -> ChatResponse:
        return ChatResponse(content="ok, noted.", usage=Usage(input_tokens=10, output_tokens=3, calls=1))

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        response = await self.chat(request)
        yield StreamEvent("text", text=response.content)
        yield StreamEvent("done", response=response)


class BenchChannel(Channel):
    name: ClassVar[str] = "bench"

    def __init__(self, submit: object) -> None:
        super().__init__(submit)  # type: ignore[arg-type]
        self.replies: asyncio.Queue[OutboundMessage] = asyncio.Queue()

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, message: OutboundMessage) -> None:
        self.replies.put_nowait(message)


async def measure(size: int, turns: int, memory: bool, root: Path) -> list[float]:
    settings = load_settings(
        env_file=None,
        overrides={
            "workspace": root / f"ws{size}",
            "llm": {"openai": {"api_key": "sk-bench-not-used"}},
            "memory": {"enabled": memory, "memory_window": 0 if not memory else 50},
        },
    )
    async with build_core(settings, llm=InstantModel()) as core:
        channel = BenchChannel(core.dispatcher.submit)
        core.dispatcher.attach(channel)
        session = await core.sessions.get_or_create("bench", "chat")
        for i in range(size):
            role = Role.USER if i % 2 == 0 else Role.ASSISTANT
            session.append(Message(role, f"message number {i} about topic {i % 17}"))
        await core.sessions.save(session)
        samples: list[float] = []
        for i in range(turns + 20):
            started = time.perf_counter()
            await core.dispatcher.submit(InboundMessage("bench", "chat", "u", f"question {i}"))
            await channel.replies.get()
            if i >= 20:  # warm-up excluded
                samples.append((time.perf_counter() - started) * 1000)
    return samples


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--sizes", default="10,1000,10000")
    parser.add_argument("--memory", action="store_true", help="run the memory systems too")
    args = parser.parse_args()
    configure_logging(level="ERROR", fmt="json")
    sizes = [int(s) for s in args.sizes.split(",")]
    medians: dict[int, float] = {}
    print(f"per-message overhead, {args.turns} turns per size, memory {'on' if args.memory else 'off'}")
    print(f"{'messages':>10} {'median ms':>10} {'p99 ms':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            samples = await measure(size, args.turns, args.memory, Path(tmp))
            medians[size] = statistics.median(samples)
            print(f"{size:>10} {medians[size]:>10.3f} {p99(samples):>8.3f}")
    largest, smallest = max(sizes), min(sizes)
    print(f"ratio {largest}/{smallest} (median): {medians[largest] / medians[smallest]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
