"""fsyncs and renames per answered message: what membot's durable path costs the disk.

Drives real turns through ``build_core`` (inbox, dispatcher, pipeline, session store, memory when
asked) with an instant in-process model, and counts every ``os.fsync``, ``os.replace`` and
``os.rename`` the process makes, by the workspace folder they touch (``inbox``, ``sessions``,
``memory``, other). The counting wraps the ``os`` functions inside this script only; cross-check with
``strace -f -c -e trace=fsync,fdatasync,rename,renameat,renameat2`` on the same command.

    python bench/durability.py [--turns 200] [--memory]

Prints, per answered message in one existing conversation: fsyncs (of files and of folders) and
renames per folder, the message path's total (inbox + sessions) and the memory writes apart.
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
    """Counts fsync and rename calls by workspace folder while ``counting`` is on."""

    def __init__(self, workspace: Path) -> None:
        self._workspace = workspace
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.counting = False

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
        if not self.counting:
            return
        try:
            folder = path.resolve().relative_to(self._workspace.resolve()).parts[0]
        except (ValueError, IndexError):
            folder = "other"
        if folder not in ("inbox", "sessions", "memory"):
            folder = "other"
        with self._lock:
            self.counts[f"{folder}: {kind}"] += 1


async def measure(turns: int, memory: bool, root: Path) -> tuple[Counter[str], int]:
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
        calls.counting = True
        for i in range(5, 5 + turns):
            await one(i)
        if memory:
            await core.memory.close()  # pending memory writes belong to these turns
        calls.counting = False
    return calls.counts, turns


def report(counts: Counter[str], turns: int) -> None:
    print(f"per answered message ({turns} messages, one conversation):")
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
    args = parser.parse_args()
    configure_logging(level="ERROR", fmt="json")
    with tempfile.TemporaryDirectory() as tmp:
        counts, turns = await measure(args.turns, args.memory, Path(tmp))
    print(f"memory {'on' if args.memory else 'off'}")
    report(counts, turns)


if __name__ == "__main__":
    asyncio.run(main())
