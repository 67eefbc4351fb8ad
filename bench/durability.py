"""fsyncs and renames per answered message: what membot's durable path costs the disk.

Drives real turns through ``build_core`` (inbox, dispatcher, pipeline, session store, memory when
asked) with an instant in-process model, and counts every ``os.fsync``, ``os.replace`` and
``os.rename`` the process makes, by the workspace folder they touch (``inbox``, ``sessions``,
``memory``, other). The counting wraps the ``os`` functions inside this script only; cross-check with
``strace -f -c -e trace=fsync,fdatasync,rename,renameat,renameat2`` on the same command.

    python bench/durability.py [--turns 200] [--memory] [--pace SECONDS]

Prints, per answered message in one existing conversation: fsyncs (of files and of folders) and
renames per folder, the message path's total (inbox + sessions) and the memory writes apart; then what
the close syncs once per run. ``--pace`` waits between a reply and the next message, as a person
does: writes synced "a moment later" are shared by turns back to back, not by turns at a human pace.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import BenchChannel, InstantModel

from bot.app import build_core
from bot.config import load_settings
from bot.domain import InboundMessage
from bot.logging import configure_logging


class DiskCalls:
    """Counts fsync and rename calls by workspace folder into ``counts`` (None: not counting)."""

    def __init__(self, workspace: Path) -> None:
        self._workspace = workspace
        self._lock = threading.Lock()
        self.counts: Counter[str] | None = None

    def install(self) -> None:
        fsync, replace, rename = os.fsync, os.replace, os.rename

        def counted_fsync(fd: Any) -> None:
            number = fd if isinstance(fd, int) else fd.fileno()
            target = Path(os.readlink(f"/proc/self/fd/{number}"))
            kind = "fsync dir" if target.is_dir() else "fsync"
            self._count(kind, target)
            fsync(fd)

        def counting(kind: str, real: Callable[..., None]) -> Callable[..., None]:
            def call(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
                self._count(kind, Path(os.fsdecode(dst)))
                real(src, dst, *args, **kwargs)

            return call

        os.fsync = counted_fsync
        os.replace = counting("rename", replace)
        os.rename = counting("rename", rename)

    def _count(self, kind: str, path: Path) -> None:
        counts = self.counts
        if counts is None:
            return
        try:
            folder = path.resolve().relative_to(self._workspace.resolve()).parts[0]
        except (ValueError, IndexError):
            folder = "other"
        if folder not in ("inbox", "sessions", "memory"):
            folder = "other"
        with self._lock:
            counts[f"{folder}: {kind}"] += 1


async def measure(
    turns: int, memory: bool, root: Path, pace: float = 0.0
) -> tuple[Counter[str], Counter[str]]:
    """The disk calls of ``turns`` answered messages, ``pace`` seconds apart, and those of the close."""
    workspace = root / "ws"
    settings = load_settings(
        env_file=None,
        overrides={
            "workspace": workspace,
            "llm": {"openai": {"api_key": "sk-bench-not-used"}},
            "memory": {"enabled": memory, "memory_window": 1_000_000},
            "compaction": {"enabled": False},
        },
    )
    calls = DiskCalls(workspace)
    calls.install()
    async with build_core(settings, llm=InstantModel()) as core:
        channel = BenchChannel(core.dispatcher.submit)
        await core.dispatcher.recover()  # as `membot run` does: the inbox is loaded before messages come
        core.dispatcher.attach(channel)

        async def one(i: int) -> None:
            await core.dispatcher.submit(
                InboundMessage("bench", "chat", "u", f"question {i}", message_id=str(i))
            )
            await channel.arrived.get()
            # The done mark after the send belongs to this message too; there is no event for it.
            while core.inbox.pending_ids("bench:chat"):  # noqa: ASYNC110
                await asyncio.sleep(0.001)

        for i in range(5):  # the conversation exists: its first save (new files) is not counted
            await one(i)
        if memory and core.memory.vectors is not None:
            await core.memory.vectors.drain()  # the vector file is made too
        calls.counts = turn_calls = Counter()
        for i in range(5, 5 + turns):
            await one(i)
            await asyncio.sleep(pace)
        # Once per run, not per message: what the close syncs (memory's pending writes, its indexes).
        calls.counts = close_calls = Counter()
        if memory:
            await core.memory.close()
        calls.counts = None
    return turn_calls, close_calls


def report(counts: Counter[str], turns: int, pace: float) -> None:
    print(f"per answered message ({turns} messages {pace:g} s apart, one conversation):")
    for key in sorted(counts):
        print(f"  {key:<24} {counts[key] / turns:6.2f}")
    message_path = ("inbox", "sessions")

    def total(kinds: tuple[str, ...], folders: tuple[str, ...]) -> float:
        hits = sum(n for k, n in counts.items() if k.split(":")[0] in folders and k.split(": ")[1] in kinds)
        return hits / turns

    fsyncs = ("fsync", "fsync dir")
    print(
        f"message path (inbox + sessions): {total(fsyncs, message_path):.2f} fsyncs, "
        f"{total(('rename',), message_path):.2f} renames per answered message"
    )
    print(
        f"memory (notes, items):           {total(fsyncs, ('memory',)):.2f} fsyncs, "
        f"{total(('rename',), ('memory',)):.2f} renames per answered message"
    )
    print(
        f"other (usage ledger, ...):       {total(fsyncs, ('other',)):.2f} fsyncs, "
        f"{total(('rename',), ('other',)):.2f} renames per answered message"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--memory", action="store_true", help="memory on (daily notes and items too)")
    parser.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="seconds between a reply and the next message (a human's pace)",
    )
    args = parser.parse_args()
    configure_logging(level="ERROR", fmt="json")
    with tempfile.TemporaryDirectory() as tmp:
        counts, at_close = await measure(args.turns, args.memory, Path(tmp), args.pace)
    print(f"memory {'on' if args.memory else 'off'}")
    report(counts, args.turns, args.pace)
    done = ", ".join(f"{key} {n}" for key, n in sorted(at_close.items())) or "nothing"
    print(f"at close (once per run, not per message): {done}")


if __name__ == "__main__":
    asyncio.run(main())
