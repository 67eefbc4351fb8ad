"""Recall of membot's memory on a LongMemEval-format dataset, with the official retrieval protocol.

For each question: a fresh memory in a temp dir, the question's haystack imported through the real
write path (bot.memory.operator.import_sessions: daily notes + heuristic items, sessions at their own
dates), then one real retrieval with the question at ``question_date``. Returned items map back to
(session id, turn index) through their references.

    python bench/memory_recall.py [DATA | --data FILE] [--k 10] [--budget TOKENS] [--out ranked.jsonl] [--limit N]
                                  [--weights hop=0,question=1] [--no-feedback] [--halves]

Prints recall_any / recall_all / ndcg_any at 5 and 10, session and turn level, overall and per question
type, plus the median retrieval latency (cold: first query after import, index build included; warm:
the same query again).

Every ranking weight was chosen on the open subset, so its figures flatter the ranking. Two checks say
how much: ``--weights`` and ``--no-feedback`` turn one mechanism off (or change its weight), and
``--halves`` prints the overall rows for two fixed halves of the questions (split by a hash of their id,
not by anything about them): a mechanism that gains on one half and loses on the other fits questions,
not conversations. The third check is data the weights never saw: ``--data bench/heldout/heldout.json.gz``
(hand-written questions, see ``bench/heldout_build.py``; built first when missing).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import hashlib
import json
import math
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ runs from the repo root

from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress

from bench.heldout_build import add_data_arguments, data_of
from bot.config import MemorySettings
from bot.errors import ConfigError
from bot.logging import configure_logging
from bot.memory.importer import parse_date, read_json, sessions_from
from bot.memory.items import ScoredItem
from bot.memory.operator import import_sessions
from bot.memory.service import MemoryService
from bot.memory.weights import Weights

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "bench" / "longmemeval_s_100.json.gz"
KS = (5, 10)
UTC = ZoneInfo("UTC")


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2020, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def refs_of(ranked: list[ScoredItem]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for scored in ranked:
        for ref in scored.item.references[:1]:
            key = (ref.session_id, ref.turn if ref.turn is not None else -1)
            if key not in out:
                out.append(key)
    return out


def metrics(ranked: list[Any], gold: set[Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k in KS:
        top = ranked[:k]
        hits = [1.0 if r in gold else 0.0 for r in top]
        out[f"recall_any@{k}"] = float(any(hits))
        out[f"recall_all@{k}"] = float(gold <= set(top))
        dcg = sum(h / math.log2(i + 2) for i, h in enumerate(hits))
        idcg = sum(1 / math.log2(i + 2) for i in range(min(k, len(gold))))
        out[f"ndcg_any@{k}"] = dcg / idcg if idcg else 0.0
    return out


def gold_of(q: dict[str, Any]) -> tuple[set[str], set[tuple[str, int]]]:
    sessions: set[str] = set()
    turns: set[tuple[str, int]] = set()
    for sid, turns_ in zip(q["haystack_session_ids"], q["haystack_sessions"], strict=True):
        if "answer" not in sid:
            continue
        for i, t in enumerate(turns_):
            if t.get("role") == "user" and t.get("has_answer"):
                sessions.add(sid)
                turns.add((sid, i))
    return sessions, turns


async def run_question(
    q: dict[str, Any],
    k: int,
    budget: int | None,
    settings: MemorySettings,
    embedder: Any = None,
    maintain: bool = False,
    weights: dict[str, float] | None = None,
) -> tuple[list[tuple[str, int]], float, float]:
    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="membot-bench-") as tmp:
        service = MemoryService(
            Path(tmp) / "memory", settings, timezone="UTC", clock=clock, embedder=embedder
        )
        if weights:
            service.retriever.weights = dataclasses.replace(service.retriever.weights, **weights)
        await service.start()
        sessions = sessions_from(q, UTC)
        if sessions:
            clock.now = sessions[-1].started
        await import_sessions(service, sessions)
        if service.vectors is not None:  # a bot that lived until the question had embedded everything
            await service.vectors.drain()
        if q.get("question_date"):
            clock.now = parse_date(str(q["question_date"]), UTC)
        if maintain:  # what a bot that lived until the question date would have done to its items
            await service.maintain()
        question = str(q.get("question") or "")
        started = time.perf_counter()
        if budget is None:
            ranked = await service.search(question, k=k)
        else:
            ranked = (await service.pack(question, soft=budget, hard=budget)).items
        cold = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        await service.search(question, k=k)
        warm = (time.perf_counter() - started) * 1000
        await service.close()
    return refs_of(ranked), cold, warm


def table(title: str, rows: dict[str, list[dict[str, float]]]) -> None:
    names = [f"{m}@{k}" for k in KS for m in ("recall_any", "recall_all", "ndcg_any")]
    print(f"\n{title}")
    print(f"{'question type':<28}{'n':>4}  " + "  ".join(f"{n:>13}" for n in names))
    for group, values in rows.items():
        means = [statistics.fmean(v[n] for v in values) for n in names]
        print(f"{group:<28}{len(values):>4}  " + "  ".join(f"{m:>13.3f}" for m in means))


def parse_weights(text: str) -> dict[str, float]:
    """``hop=0,question=1`` as {field: value}; a name that is not a :class:`Weights` field is an error."""
    fields = {f.name: f.type for f in dataclasses.fields(Weights)}
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in fields:
            raise SystemExit(f"error: --weights: no weight {name!r}; the weights are {', '.join(fields)}")
        try:
            out[name] = int(value) if fields[name] in ("int", int) else float(value)
        except ValueError:
            raise SystemExit(f"error: --weights: {part!r} is not name=number") from None
    return out


def half_of(question_id: str) -> str:
    """A fixed half, "a" or "b", by a hash of the id: the same split on every run and every machine."""
    return "ab"[hashlib.blake2b(question_id.encode(), digest_size=1).digest()[0] % 2]


def check(q: Any, index: int) -> dict[str, Any]:
    """The question as a dict with the fields the protocol needs, or a ConfigError naming what is off."""
    if not isinstance(q, dict):
        raise ConfigError(f"question #{index} is not an object")
    missing = [f for f in ("haystack_session_ids", "haystack_dates", "haystack_sessions") if f not in q]
    if missing:
        raise ConfigError(f"question #{index} ({q.get('question_id', '?')}) lacks {', '.join(missing)}")
    lengths = {len(q[f]) for f in ("haystack_session_ids", "haystack_dates", "haystack_sessions")}
    if len(lengths) != 1:
        raise ConfigError(f"question #{index}: haystack ids, dates and sessions differ in length")
    return {"question_id": f"q{index}", **q}


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_data_arguments(parser, DEFAULT_DATA)
    parser.add_argument("--k", type=int, default=10, help="how many references to return (1-50)")
    parser.add_argument("--budget", type=int, default=None, help="score what fits this many tokens instead")
    parser.add_argument("--out", type=Path, default=None, help="write one JSON line per question")
    parser.add_argument("--limit", type=int, default=None, help="only the first N questions")
    parser.add_argument(
        "--embeddings",
        choices=["none", "local"],
        default="none",
        help="fuse the local embedding model's signal (all-MiniLM-L6-v2 int8, bundled)",
    )
    parser.add_argument(
        "--embedding-cache",
        type=Path,
        default=None,
        help="remember vectors by text in this .npz across runs (same figures, no repeated model time)",
    )
    parser.add_argument(
        "--weights",
        type=parse_weights,
        default={},
        help="change ranking weights for this run, e.g. hop=0,question=1 (bot/memory/weights.py Weights)",
    )
    parser.add_argument(
        "--no-feedback",
        action="store_true",
        help="without pseudo-relevance feedback in meaning (the query's vector is not moved)",
    )
    parser.add_argument(
        "--halves",
        action="store_true",
        help="also print the overall rows of two fixed halves of the questions",
    )
    parser.add_argument(
        "--maintain",
        action="store_true",
        help="promote and decay items at the question date first, as the running bot does daily",
    )
    args = parser.parse_args()
    k = max(1, min(50, args.k))
    args.data = data_of(args)
    configure_logging(level="WARNING", fmt="console")
    try:
        data = read_json(args.data)
        questions = [check(q, i) for i, q in enumerate(data if isinstance(data, list) else [data])]
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    questions = questions[: args.limit] if args.limit else questions
    settings = MemorySettings(embeddings=args.embeddings)
    if args.no_feedback:  # an ablation: every query's Feedback picks no seeds
        import bot.memory.relevant

        bot.memory.relevant.Feedback = functools.partial(bot.memory.relevant.Feedback, seeds=0)  # type: ignore[misc]
    embedder = None
    if args.embeddings == "local":
        from bot.memory.embeddings import build_embedder

        embedder = build_embedder(settings, None)  # loaded once, shared by every question
        if args.embedding_cache is not None:
            from bench.embedding_cache import CachedEmbedder

            embedder = CachedEmbedder(embedder, args.embedding_cache)
    session_rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    turn_rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    cold_ms: list[float] = []
    warm_ms: list[float] = []
    turns_per_q: list[int] = []
    out = args.out.open("w", encoding="utf-8") if args.out else None
    progress = Progress(
        *Progress.get_default_columns(), MofNCompleteColumn(), console=Console(stderr=True), transient=True
    )
    try:
        with progress:
            for q in progress.track(questions, description="questions"):
                try:
                    ranked, cold, warm = await run_question(
                        q, k, args.budget, settings, embedder, args.maintain, args.weights
                    )
                except ConfigError as exc:
                    raise SystemExit(f"error in question {q['question_id']}: {exc}") from None
                cold_ms.append(cold)
                warm_ms.append(warm)
                turns_per_q.append(sum(len(s) for s in q["haystack_sessions"]))
                if out is not None:
                    refs = [{"session_id": s, "turn": t} for s, t in ranked]
                    out.write(json.dumps({"question_id": q["question_id"], "ranked": refs}) + "\n")
                    out.flush()
                gold_sessions, gold_turns = gold_of(q)
                if str(q["question_id"]).endswith("_abs") or not gold_sessions:
                    continue
                session_ranked = list(dict.fromkeys(s for s, _ in ranked))
                for rows, m in (
                    (session_rows, metrics(session_ranked, gold_sessions)),
                    (turn_rows, metrics(ranked, gold_turns)),
                ):
                    rows[str(q.get("question_type") or "unknown")].append(m)
                    rows["ALL"].append(m)
                    if args.halves:
                        rows[f"half {half_of(str(q['question_id']))}"].append(m)
    finally:
        if out is not None:
            out.close()
        if hasattr(embedder, "save"):
            embedder.save()
    mode = f"budget {args.budget} tokens" if args.budget else f"top {k}"
    signal = "lexical + local embeddings" if args.embeddings == "local" else "lexical only"
    if args.maintain:
        signal += "; items maintained at the question date"
    if args.weights or args.no_feedback:
        changes = [f"{k}={v}" for k, v in args.weights.items()] + (
            ["no feedback"] if args.no_feedback else []
        )
        signal += f"; changed: {', '.join(changes)}"
    print(f"{len(questions)} questions, {len(session_rows['ALL'])} scored; returned: {mode}; {signal}")
    if session_rows["ALL"]:
        table("SESSION level", dict(sorted(session_rows.items())))
        table("TURN level", dict(sorted(turn_rows.items())))
    if cold_ms:
        print(
            f"\nretrieval latency median: cold {statistics.median(cold_ms):.1f} ms (first query, index "
            f"build included), warm {statistics.median(warm_ms):.1f} ms; "
            f"median memory size {statistics.median(turns_per_q):.0f} turns"
        )


if __name__ == "__main__":
    asyncio.run(main())
