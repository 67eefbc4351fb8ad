"""What the Telegram update journal costs per message: accept (store before confirming) + release.

Each message costs two atomic rewrites of ``state/telegram_updates.json`` (temp file, fsync, rename,
folder fsync): one when its batch is accepted, one when the dispatcher has it. The file holds the
updates still waiting (normally a handful, up to ``held_limit`` during an outage) and the newest
``done_limit`` ids, so its size, and the cost, depends on how many wait. This times one message at a
time with 0, 50 and 400 others waiting.

    python bench/telegram_journal.py [--messages 200] [--waiting 0,50,400]

Prints the median and p99 milliseconds per message for each number waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from channels.telegram.journal import JOURNAL_FILE, UpdateJournal


def update(update_id: int) -> dict[str, Any]:
    text = "a typical question of a few words, asked in a private chat " * 3
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": 1732270000,
            "chat": {"id": 777, "type": "private"},
            "from": {"id": 42, "is_bot": False, "first_name": "Alice"},
            "text": text,
        },
    }


async def measure(waiting: int, messages: int, root: Path) -> list[float]:
    journal = UpdateJournal(root / f"w{waiting}" / JOURNAL_FILE)
    await journal.load(bot_id=1)
    await journal.accept([update(i) for i in range(1, waiting + 1)])
    timings = []
    for update_id in range(10_000, 10_000 + messages):
        started = time.perf_counter()
        await journal.accept([update(update_id)])
        await journal.next()
        await journal.release([update_id])
        timings.append((time.perf_counter() - started) * 1000)
    await journal.close()
    return timings


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--waiting", default="0,50,400")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for waiting in (int(w) for w in args.waiting.split(",")):
            timings = await measure(waiting, args.messages, Path(tmp))
            p99 = statistics.quantiles(timings, n=100)[98]
            size = (Path(tmp) / f"w{waiting}" / JOURNAL_FILE).stat().st_size
            print(
                f"{waiting:>4} waiting: median {statistics.median(timings):6.2f} ms, p99 {p99:6.2f} ms "
                f"per message (file {size / 1024:.0f} KiB)"
            )


if __name__ == "__main__":
    asyncio.run(main())
