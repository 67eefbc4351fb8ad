"""Scale of the vector store: start-up, query latency and memory at 500, 10,000 and 100,000 vectors.

Each size runs in a fresh process: a vector file of random unit vectors (384 dimensions, float16, as
all-MiniLM-L6-v2 writes them) is created, then timed: loading it (``VectorStore.start``), the RSS it
adds, and queries through the real bundled model:

- first query: the first ``nearest(k=50)`` after start (query embedding + scoring every vector);
- warm query: the median over 30 new query texts (embedding + scoring);
- scoring only: the median over 30 repeats of one query (its vector cached: numpy alone);
- 2,000 candidates: ``similarities`` over 2,000 given fingerprints (a retrieval's candidate set).

Load and scoring are also given as CPU time: on a shared machine wall time counts the waiting too.

    python bench/vectors.py [--sizes 500,10000,100000] [--threads N]

The file is in the page cache when it is loaded (it was just written); a cold disk adds its read time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bot.logging import configure_logging
from bot.memory import vector_file
from bot.memory.embeddings import OnnxEmbedder
from bot.memory.vectors import VectorStore

DIM = 384
QUERIES = [f"what did I say about topic {i} and the trip to the mountains?" for i in range(31)]


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def one(size: int, threads: int | None) -> dict[str, float]:
    rng = np.random.default_rng(size)
    rows = rng.standard_normal((size, DIM)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    keys = [f"{i:024x}" for i in range(size)]
    embedder = OnnxEmbedder(threads=threads)
    with tempfile.TemporaryDirectory(prefix="membot-vectors-") as tmp:
        folder = Path(tmp)
        path = vector_file.file_for(folder, embedder.model_id)
        vector_file.rewrite(path, embedder.model_id, DIM, keys, rows.astype(np.float16))
        del rows
        embedder.load()  # the model's own load is the embeddings bench's business
        store = VectorStore(folder, embedder)
        before = rss_mb()
        started, started_cpu = time.perf_counter(), time.process_time()
        await store.start()
        load, load_cpu = time.perf_counter() - started, time.process_time() - started_cpu
        added = rss_mb() - before
        started = time.perf_counter()
        await store.nearest(QUERIES[0], k=50)
        first = time.perf_counter() - started
        warm, scoring, subset = [], [], []
        for query in QUERIES[1:]:
            started = time.perf_counter()
            await store.nearest(query, k=50)
            warm.append(time.perf_counter() - started)
        scoring_cpu = []
        for _ in range(30):
            started, started_cpu = time.perf_counter(), time.process_time()
            await store.nearest(QUERIES[-1], k=50)
            scoring.append(time.perf_counter() - started)
            scoring_cpu.append(time.process_time() - started_cpu)
        candidates = keys[:: max(1, size // 2000)][:2000]
        for _ in range(30):
            started = time.perf_counter()
            await store.similarities(QUERIES[-1], candidates)
            subset.append(time.perf_counter() - started)
        await store.close()
        return {
            "vectors": store.count,
            "file_mb": path.stat().st_size / 2**20,
            "load_ms": load * 1000,
            "load_cpu_ms": load_cpu * 1000,
            "rss_mb": added,
            "first_ms": first * 1000,
            "warm_ms": median_ms(warm),
            "scoring_ms": median_ms(scoring),
            "scoring_cpu_ms": median_ms(scoring_cpu),
            "subset_ms": median_ms(subset),
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="500,10000,100000")
    parser.add_argument("--threads", type=int, default=None, help="model threads (default: the runtime's)")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        configure_logging(level="WARNING", fmt="console")
        print(json.dumps(asyncio.run(one(args.one, args.threads))))
        return
    columns = ["vectors", "file_mb", "load_ms", "load_cpu_ms", "rss_mb", "first_ms", "warm_ms"]
    columns += ["scoring_ms", "scoring_cpu_ms", "subset_ms"]
    titles = ["vectors", "file MB", "load ms", "load CPU", "RSS +MB", "1st query", "warm query"]
    titles += ["scoring", "scoring CPU", "2k cands"]
    print("  ".join(f"{t:>10}" for t in titles))
    for size in (int(s) for s in args.sizes.split(",")):
        command = [sys.executable, __file__, "--one", str(size)]
        if args.threads:
            command += ["--threads", str(args.threads)]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        result = json.loads(output.strip().splitlines()[-1])
        print("  ".join(f"{result[c]:>10,.0f}" if c == "vectors" else f"{result[c]:>10.1f}" for c in columns))
    print("(ms, medians; queries are nearest(k=50) over every vector through the bundled model; CPU: process")
    print(" CPU time, what it costs on idle cores, since on a shared machine wall time also counts waiting)")


if __name__ == "__main__":
    main()
