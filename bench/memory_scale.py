"""Memory at scale: start-up, retrieval latency (cold and warm) and RSS at 500, 10,000 and 100,000 items.

For each size, one process builds a memory through the real write path (``record_exchanges``: notes,
items, extraction, the item logs, and — with embeddings — the vector store's background queue), from
the user and assistant turns of the LongMemEval file cycled with a counter so no two are identical.
A second, fresh process then starts the memory service on that folder (what ``membot run`` does) and
measures start-up, the first query (cold) and the same kind of query again (warm, median of 50
different questions), and its RSS. It also counts embedder calls after the restart: there must be none
(vectors are loaded, never recomputed). Last it runs the daily maintenance twice (promotion, decay, log
compaction, the snapshot and the lexical index saved) while a ticker task measures how long the event
loop, which every chat's turns share, was held up at a time: the first finds every item 400 days
unused (all of them decay, and their logs are compacted: a bot back after a long pause), the second
has nothing to change (the usual day).

    python bench/memory_scale.py [DATA] [--sizes 500,10000,100000] [--embeddings none|hash|local]

``hash`` is a deterministic stand-in embedder (a hashed bag of words, 384 dimensions, no model): it
measures what the vector store costs at scale without an hour of model time for 100,000 items. The
model's own cost per query (~8 ms on one core for a short message) is printed by ``bench/vectors.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bot.config import MemorySettings
from bot.domain import Message, Role
from bot.logging import configure_logging
from bot.memory.importer import read_json
from bot.memory.recorder import Exchange
from bot.memory.service import MemoryService

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "bench" / "longmemeval_s_100.json.gz"
START = datetime(2023, 1, 1, tzinfo=UTC)


class HashEmbedder:
    """Unit vectors from hashed words: similar texts get similar vectors, at no model cost."""

    model_id = "bench:hash-384"

    def __init__(self) -> None:
        self.texts = 0

    async def embed(self, texts: Sequence[str]) -> Any:
        self.texts += len(texts)
        out = np.zeros((len(texts), 384), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row, int(hashlib.blake2b(word.encode(), digest_size=4).hexdigest(), 16) % 384] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)


def embedder_for(kind: str) -> Any:
    if kind == "hash":
        return HashEmbedder()
    if kind == "local":
        from bot.memory.embeddings import build_embedder

        return build_embedder(MemorySettings(embeddings="local"))
    return None


def turns_of(data: Path) -> tuple[list[tuple[str, str]], list[str]]:
    questions = read_json(data)
    pairs: list[tuple[str, str]] = []
    asked: list[str] = []
    for q in questions if isinstance(questions, list) else [questions]:
        asked.append(str(q["question"]))
        for session in q["haystack_sessions"]:
            for user, answer in zip(session[::2], session[1::2], strict=False):
                if user.get("role") == "user" and answer.get("role") == "assistant":
                    pairs.append((str(user["content"]), str(answer["content"])))
    return pairs, asked


async def build(folder: Path, size: int, data: Path, kind: str) -> dict[str, Any]:
    pairs, _ = turns_of(data)
    memory = MemoryService(folder, MemorySettings(), clock=lambda: START, embedder=embedder_for(kind))
    await memory.start()
    started = time.perf_counter()
    i = 0
    while len(memory.items.items()) < size:
        batch = []
        for _ in range(100):
            user, answer = pairs[i % len(pairs)]
            when = START + timedelta(minutes=i)
            tag = f" (#{i})"  # every exchange distinct, as real ones are
            batch.append(
                Exchange(
                    "bench:chat",
                    Message(Role.USER, user + tag, timestamp=when),
                    Message(Role.ASSISTANT, answer + tag, timestamp=when),
                )
            )
            i += 1
        await memory.record_exchanges(batch)
    if memory.vectors is not None:
        await memory.vectors.drain()
    await memory.close()
    return {"items": len(memory.items.items()), "exchanges": i, "build_s": time.perf_counter() - started}


async def measure(folder: Path, asked: list[str], kind: str) -> dict[str, Any]:
    embedder = embedder_for(kind)
    started = time.perf_counter()
    memory = MemoryService(
        folder, MemorySettings(), clock=lambda: START + timedelta(days=400), embedder=embedder
    )
    await memory.start()
    startup = time.perf_counter() - started
    embedded_at_start = getattr(embedder, "texts", 0)
    t0 = time.perf_counter()
    await memory.context(asked[0], session_id="bench:chat")
    cold = (time.perf_counter() - t0) * 1000
    warm: list[float] = []
    for question in asked[1:51]:
        t0 = time.perf_counter()
        await memory.context(question, session_id="bench:chat")
        warm.append((time.perf_counter() - t0) * 1000)
    rss = peak_rss_mib()  # serving: before the maintenance's snapshot (a pickle of every item) adds its own
    heavy, heavy_stall = await held_up(memory.maintain())
    usual, usual_stall = await held_up(memory.maintain())
    await memory.close()
    return {
        "maintain_all_s": heavy,
        "maintain_all_stall_ms": heavy_stall,
        "maintain_s": usual,
        "maintain_stall_ms": usual_stall,
        "items": len(memory.items.items()),
        "startup_s": startup,
        "cold_ms": cold,
        "warm_ms": statistics.median(warm),
        "warm_p95_ms": sorted(warm)[int(len(warm) * 0.95)],
        "rss_mib": rss,
        # Texts embedded after the restart, the 51 questions aside: items must not be embedded again.
        "embeds_after_restart": getattr(embedder, "texts", 0) - embedded_at_start - 51
        if kind == "hash"
        else None,
    }


async def held_up(work: Any) -> tuple[float, float]:
    """Seconds ``work`` took, and the longest the event loop went without running a ticker that asks for
    it every millisecond (what a turn arriving meanwhile would have waited), in ms."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    await work
    took = time.perf_counter() - started
    done.set()
    await ticking
    return took, max(gaps) * 1000


def peak_rss_mib() -> float:
    """This process's peak RSS. Not ``ru_maxrss``: after fork and exec that includes the parent's."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(mode: str, folder: Path, size: int, data: Path, kind: str) -> None:
    configure_logging(level="ERROR", fmt="json")
    job = (
        build(folder, size, data, kind)
        if mode == "build"
        else measure(folder, json.loads((folder.parent / "asked.json").read_text()), kind)
    )
    print(json.dumps(asyncio.run(job)))


def run(mode: str, folder: Path, size: int, data: Path, kind: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(folder), str(size), str(data), kind],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, mode, folder, size, data, kind = sys.argv
        child(mode, Path(folder), int(size), Path(data), kind)
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("data", nargs="?", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--sizes", default="500,10000,100000")
    parser.add_argument("--embeddings", choices=["none", "hash", "local"], default="hash")
    args = parser.parse_args()
    _, asked = turns_of(args.data)
    print(
        f"memory at scale; embeddings: {args.embeddings}; each size built, then measured in a fresh process"
    )
    print(
        f"{'items':>8} {'build s':>8} {'start s':>8} {'cold ms':>8} {'warm ms':>8} {'p95 ms':>8} {'RSS MiB':>8} "
        f"{'re-embeds':>9}  maintenance s (longest hold-up ms): all decay / usual"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="membot-scale-") as tmp:
            folder = Path(tmp) / "memory"
            (Path(tmp) / "asked.json").write_text(json.dumps(asked[:51]))
            built = run("build", folder, size, args.data, args.embeddings)
            seen = run("measure", folder, size, args.data, args.embeddings)
        again = "-" if seen["embeds_after_restart"] is None else str(seen["embeds_after_restart"])
        print(
            f"{seen['items']:>8} {built['build_s']:>8.1f} {seen['startup_s']:>8.2f} {seen['cold_ms']:>8.1f} "
            f"{seen['warm_ms']:>8.1f} {seen['warm_p95_ms']:>8.1f} {seen['rss_mib']:>8.0f} {again:>9}  "
            f"{seen['maintain_all_s']:.1f} ({seen['maintain_all_stall_ms']:.0f}) / "
            f"{seen['maintain_s']:.1f} ({seen['maintain_stall_ms']:.0f})",
            flush=True,
        )
    print(
        "targets: warm <= 20 ms at 500 turns and <= 50 ms at 100,000 items; start-up <= 3 s at 100,000; 0 re-embeds"
    )


if __name__ == "__main__":
    main()
