"""Per-message overhead of membot, as a session grows: through the real LLM client, and in process.

The model answers instantly, so what is timed is membot's own work per message: intake (durable
inbox), the session lane, every pipeline system, saving the session, and handing the reply to the
channel; in the ``openai`` and ``anthropic`` columns also building the request, encoding it to JSON,
the HTTP round trip through the real LLM client (httpx) to an instant model server in its own process
(instant_llm.py) and decoding the answer: the figure users feel. The ``in-process`` column swaps the
client for an in-process stand-in (no request, no JSON, no HTTP), isolating the bot's own systems.

    python bench/overhead.py [--turns 200] [--sizes 10,1000,10000] [--memory on|off|both]
                             [--columns in-process,openai,anthropic]

Prints, per size (prior messages in the session when the run starts; each turn adds two, and with memory
off nothing trims them) and client: median and p99 wall time per message, the bot process's CPU time
per message, the size of the last request body, and the ratio of the largest to the smallest median. Targets (issue 19), 10 prior
messages through the real client: median <= 5 ms with memory off, <= 8 ms with memory on.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import BenchChannel, InstantModel, bench_settings, cpu_seconds, percentile
from instant_llm import InstantLLM

from bot.app import build_core
from bot.domain import InboundMessage, Message, Role
from bot.lifecycle import settle_heap
from bot.logging import configure_logging

WARM_UP = 20
COLUMNS = ("in-process", "openai", "anthropic")


@dataclass(frozen=True, slots=True)
class Run:
    samples: list[float]  # milliseconds per message, wall clock
    cpu_ms: float  # this process's CPU time per message (the model server's excluded)


async def measure(size: int, turns: int, *, memory: bool, column: str, llm: InstantLLM, root: Path) -> Run:
    """``turns`` messages after ``WARM_UP``, into a session that starts with ``size`` prior messages."""
    if column == "in-process":
        settings = bench_settings(root, memory=memory)
    else:
        base = llm.anthropic_base_url if column == "anthropic" else llm.openai_base_url
        settings = bench_settings(root, memory=memory, provider=column, base_url=base)
    async with build_core(settings, llm=InstantModel() if column == "in-process" else None) as core:
        channel = BenchChannel(core.dispatcher.submit)
        core.dispatcher.attach(channel)
        session = await core.sessions.get_or_create("bench", "chat")
        for i in range(size):
            role = Role.USER if i % 2 == 0 else Role.ASSISTANT
            session.append(Message(role, f"message number {i} about topic {i % 17}"))
        await core.sessions.save(session)
        settle_heap()  # what `membot run` does once its channels are up (bot/lifecycle.py)
        replies = channel.inbox("chat")
        samples: list[float] = []
        cpu = 0.0
        for i in range(turns + WARM_UP):
            if i == WARM_UP:
                if core.memory.vectors is not None:  # steady state: earlier messages have their vectors,
                    await core.memory.vectors.drain()  # so every query is embedded and compared
                cpu = cpu_seconds()
            started = time.perf_counter()
            await channel.handle_inbound(InboundMessage("bench", "chat", "u", f"question {i}"))
            await replies.get()
            if i >= WARM_UP:
                samples.append((time.perf_counter() - started) * 1000)
        cpu = cpu_seconds() - cpu
    return Run(samples, cpu * 1000 / turns)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--sizes", default="10,1000,10000")
    parser.add_argument("--memory", choices=["on", "off", "both"], default="both")
    parser.add_argument("--columns", default=",".join(COLUMNS), help="in-process, openai, anthropic")
    args = parser.parse_args()
    configure_logging(level="ERROR", fmt="json")
    sizes = [int(s) for s in args.sizes.split(",")]
    columns = [c for c in args.columns.split(",") if c]
    unknown = set(columns) - set(COLUMNS)
    if unknown:
        parser.error(f"unknown column(s) {', '.join(sorted(unknown))}; choose from {', '.join(COLUMNS)}")
    memories = [False, True] if args.memory == "both" else [args.memory == "on"]
    print(
        f"per-message overhead in ms, {args.turns} turns per size after {WARM_UP} warm-up turns; "
        "openai/anthropic: real client over HTTP to an instant model in another process;\n"
        "cpu/msg: CPU time of the bot process per message; request KB: the last request's body"
    )
    with InstantLLM() as llm, tempfile.TemporaryDirectory() as tmp:
        for memory in memories:
            print(f"\nmemory {'on' if memory else 'off'}")
            print(
                f"{'messages':>8}  {'client':<10} {'median':>8} {'p99':>8} {'cpu/msg':>8} {'request KB':>10}"
            )
            medians: dict[tuple[str, int], float] = {}
            for size in sizes:
                for column in columns:
                    root = Path(tmp) / f"{column}-{size}-{'on' if memory else 'off'}"
                    run = await measure(size, args.turns, memory=memory, column=column, llm=llm, root=root)
                    medians[column, size] = statistics.median(run.samples)
                    request = "-"
                    if column != "in-process":
                        _, last_bytes = await asyncio.to_thread(llm.stats)
                        request = f"{last_bytes / 1024:.1f}"
                    print(
                        f"{size:>8}  {column:<10} {medians[column, size]:>8.2f} "
                        f"{percentile(run.samples, 0.99):>8.2f} {run.cpu_ms:>8.2f} {request:>10}",
                        flush=True,
                    )
            largest, smallest = max(sizes), min(sizes)
            ratios = ", ".join(f"{c} {medians[c, largest] / medians[c, smallest]:.2f}" for c in columns)
            print(f"ratio {largest}/{smallest} (median): {ratios}")
    print("\ntarget, 10 prior messages through the real client: median <= 5 ms memory off, <= 8 ms on")


if __name__ == "__main__":
    asyncio.run(main())
