"""Throughput and latency under load: N chats x M messages through the real dispatcher and LLM client.

The bot is the real one (bot.app.build_core: durable inbox, session lanes, every pipeline system,
sessions on disk, memory) in this process; the model is instant and answers over HTTP from its own
process (instant_llm.py), reached by the real LLM client (httpx), so what is measured is membot's own
cost per message, the way users feel it.

Two ways to send:

- ``closed``: every chat sends its next message when the reply to the previous one arrived (one turn
  per message; the issue's "200 chats x 5 messages" figure);
- ``burst``: every message of every chat is submitted at once; the dispatcher's default ``collect`` mode
  then answers what queued up during a turn together, so there may be fewer turns than messages.

    python bench/concurrency.py [--chats 200] [--messages 5] [--mode closed|burst|both]
                                [--memory on|off|both] [--provider openai|anthropic]

Prints, per run: messages/s (all messages / time from the first submit to the last reply), median and
p99 latency per message (submit to the reply that answered it), turns, and the bot process's CPU
seconds per turn and per message (time.process_time: every thread of this process, the model server
excluded). Targets (issue 19): >= 100 messages/s and p99 <= 5 s with memory on, memory-on throughput
>= 0.8 x memory-off.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import BenchChannel, Reply, bench_settings, cpu_seconds, percentile
from instant_llm import InstantLLM

from bot.app import build_core
from bot.domain import InboundMessage
from bot.lifecycle import settle_heap
from bot.logging import configure_logging

# Realistic user messages: some carry a preference or a fact, which memory extracts as typed items.
TOPICS = ["jazz", "hiking", "sourdough", "chess", "Rust", "gardening", "Lisbon", "cycling", "sushi", "Python"]
TEMPLATES = [
    "What is a good way to get started with {topic}? I have about an hour a day.",
    "I really like {topic}, and my friend {chat} suggested I write it down somewhere.",
    "Can you remind me what we said about {topic} last week? I forgot the details.",
    "My dog is called Rufus {chat} and he hates {topic}, which is a problem on weekends.",
    "I have decided to spend more time on {topic} this month; what should I read first?",
]


@dataclass(frozen=True, slots=True)
class Result:
    messages: int
    turns: int
    seconds: float
    latencies: list[float]
    cpu: float

    def row(self, label: str) -> str:
        rate = self.messages / self.seconds
        return (
            f"{label:<18} {rate:>8.1f} {statistics.median(self.latencies):>9.3f} "
            f"{percentile(self.latencies, 0.99):>8.3f} {self.turns:>6} "
            f"{self.cpu / max(1, self.turns) * 1000:>10.1f} {self.cpu / self.messages * 1000:>9.1f}"
        )


def text(chat: int, index: int) -> str:
    template = TEMPLATES[(chat + index) % len(TEMPLATES)]
    return template.format(topic=TOPICS[(chat * 7 + index * 3) % len(TOPICS)], chat=chat)


def message(chat: int, index: int) -> InboundMessage:
    return InboundMessage(
        "bench", f"chat{chat}", f"user{chat}", text(chat, index), message_id=f"{chat}:{index}"
    )


async def run(
    chats: int, messages: int, *, mode: str, memory: bool, provider: str, base_url: str, root: Path
) -> Result:
    settings = bench_settings(root, memory=memory, provider=provider, base_url=base_url)
    async with build_core(settings) as core:
        channel = BenchChannel(core.dispatcher.submit, core.dispatcher.queue_depth)
        core.dispatcher.attach(channel)
        settle_heap()  # what `membot run` does once its channels are up (bot/lifecycle.py)
        cpu_before, turns_before = cpu_seconds(), core.dispatcher.turns_completed
        started = time.perf_counter()
        if mode == "closed":
            per_chat = await asyncio.gather(*(closed_loop(channel, c, messages) for c in range(chats)))
            latencies = [x for chat in per_chat for x in chat]
        else:
            latencies = await burst(channel, chats, messages)
        seconds = max(r.at for r in channel.replies) - started
        cpu = cpu_seconds() - cpu_before
        turns = core.dispatcher.turns_completed - turns_before
    errors = [r for r in channel.replies if r.message.is_error]
    if errors:
        raise RuntimeError(f"{len(errors)} turns failed, e.g.: {errors[0].message.text}")
    return Result(chats * messages, turns, seconds, latencies, cpu)


async def closed_loop(channel: BenchChannel, chat: int, messages: int) -> list[float]:
    inbox = channel.inbox(f"chat{chat}")
    latencies = []
    for index in range(messages):
        sent = time.perf_counter()
        await channel.handle_inbound(message(chat, index))
        reply = await inbox.get()
        latencies.append(reply.at - sent)
    return latencies


async def burst(channel: BenchChannel, chats: int, messages: int) -> list[float]:
    """Submit everything at once; a message's latency runs to the reply of the turn that took it.

    In ``collect`` mode a turn answers every message queued before it started, replying to the first
    of them, so message ``i`` is answered by the last reply (in order) whose ``reply_to`` is <= ``i``.
    """
    sent: dict[str, float] = {}

    async def submit(chat: int, index: int) -> None:
        inbound = message(chat, index)
        sent[inbound.message_id] = time.perf_counter()
        await channel.handle_inbound(inbound)

    # Message 0 of every chat, then message 1...: each chat's messages are queued in order.
    await asyncio.gather(*(submit(c, i) for i in range(messages) for c in range(chats)))
    latencies: list[float] = []
    for chat in range(chats):
        replies: list[Reply] = []
        inbox = channel.inbox(f"chat{chat}")
        last = sent[f"{chat}:{messages - 1}"]
        # Queuing is synchronous from the timestamp on, so a reply after the chat's last message was
        # queued, with nothing of that chat still queued, comes from the turn that took it (or later).
        while not replies or replies[-1].queued_after or replies[-1].at < last:
            replies.append(await inbox.get())
        for index in range(messages):
            answered = [r for r in replies if int((r.message.reply_to or "0:0").split(":")[1]) <= index]
            latencies.append(answered[-1].at - sent[f"{chat}:{index}"])
    return latencies


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chats", type=int, default=200)
    parser.add_argument("--messages", type=int, default=5)
    parser.add_argument("--mode", choices=["closed", "burst", "both"], default="both")
    parser.add_argument("--memory", choices=["on", "off", "both"], default="both")
    parser.add_argument("--provider", choices=["openai", "anthropic"], default="openai")
    args = parser.parse_args()
    configure_logging(level="ERROR", fmt="json")
    modes = ["closed", "burst"] if args.mode == "both" else [args.mode]
    memories = [True, False] if args.memory == "both" else [args.memory == "on"]
    print(
        f"{args.chats} chats x {args.messages} messages, real {args.provider} client over HTTP to an "
        "instant model in another process"
    )
    print(
        f"{'run':<18} {'msgs/s':>8} {'median s':>9} {'p99 s':>8} {'turns':>6} "
        f"{'cpu ms/turn':>10} {'cpu ms/msg':>9}"
    )
    rates: dict[tuple[str, bool], float] = {}
    with InstantLLM() as llm, tempfile.TemporaryDirectory() as tmp:
        base = llm.anthropic_base_url if args.provider == "anthropic" else llm.openai_base_url
        for mode in modes:
            for memory in memories:
                root = Path(tmp) / f"{mode}-{'on' if memory else 'off'}"
                result = await run(
                    args.chats,
                    args.messages,
                    mode=mode,
                    memory=memory,
                    provider=args.provider,
                    base_url=base,
                    root=root,
                )
                rates[mode, memory] = result.messages / result.seconds
                print(result.row(f"{mode}, memory {'on' if memory else 'off'}"), flush=True)
    for mode in modes:
        if (mode, True) in rates and (mode, False) in rates:
            ratio = rates[mode, True] / rates[mode, False]
            print(f"{mode}: memory-on / memory-off throughput {ratio:.2f} (target >= 0.8)")
    print("targets, memory on: >= 100 messages/s, p99 <= 5 s")


if __name__ == "__main__":
    asyncio.run(main())
