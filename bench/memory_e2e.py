"""What reaches the model: membot's memory measured end to end, through the real dispatcher and pipeline.

For each question of a LongMemEval-format file, in a fresh workspace:

1. every haystack session is fed message by message through ``Dispatcher.submit`` — user turns as user
   messages dated at their session's date, each assistant turn as the bot's answer (the fake model
   returns the recorded text) — with ``/new`` after each session;
2. the question is asked as a new message dated ``question_date``;
3. the request the model received for it (system prompt + messages, as sent over HTTP to a fake
   OpenAI-compatible server on 127.0.0.1) is searched for every evidence turn (``has_answer``).

The fake answers consolidation with valid, empty JSON and compaction with a content-free summary, so
what reaches the model is what membot's own memory stored, chose and rendered. An evidence turn counts
as *reached* when its whole text (whitespace folded) is in the request; *partial* when at least half of
its sentences are. Consecutive user turns are sent as one message (as collect mode would join them); a
session that opens with assistant turns gets a neutral user message first (the bot only ever answers).

    python bench/memory_e2e.py [DATA | --data FILE] [--limit N] [--jobs J] [--out FILE] [--only ID,ID]
                               [--embeddings default|none|local] [--embedding-cache FILE]

DATA defaults to the open LongMemEval subset; ``--data bench/heldout/heldout.json.gz`` runs the held-out
set (hand-written questions, see ``bench/heldout_build.py``), built first when missing.

Memory runs with membot's default settings (local embeddings on). Each worker embeds a distinct text
once: the haystacks share most of their sessions, and the model's vector for a text never changes
(``--embedding-cache`` keeps them across runs). Embedding runs in the background, as in the bot, and the
vector queue is drained before each question, so the time per fed message is the reply path's.

Prints, overall and per question type: evidence reach, share of questions with all evidence reached,
partial reach, prompt tokens of the question's request (median, p95) and the time per fed message
(median, p95); then where the evidence was found. Prompt tokens, in the offline gpt-4.1-mini encoding,
are the request as the issue defines it: the system prompt and every message's text (+4 tokens of
framing per message). The tool definitions (the request's ``tools`` array as JSON text, as sent over
HTTP) are the same for every request and counted apart ("+tools"): the whole request is the sum.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ runs from the repo root

from harness import BenchChannel
from heldout_build import add_data_arguments, data_of
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress, TimeElapsedColumn

from bot.app import build_core
from bot.compaction import SUMMARY_SYSTEM
from bot.config import load_settings
from bot.domain import InboundMessage
from bot.errors import ConfigError
from bot.logging import configure_logging
from bot.memory.consolidation import SYSTEM as CONSOLIDATION_SYSTEM
from bot.memory.importer import parse_date, read_json
from bot.tokens import TokenCounter
from tests.fakes.llm_server import FakeLLMServer, FakeReply

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "bench" / "longmemeval_s_100.json.gz"
UTC = ZoneInfo("UTC")
OPENER = "(continuing our conversation)"  # before a session that starts with the assistant speaking
NO_ANSWER = "Noted."  # the bot's answer to a user turn the recording has no answer for
EMPTY_CONSOLIDATION = json.dumps({"history_entry": "", "memory_update": "", "items": []})
EMPTY_SUMMARY = "- Earlier messages of this chat (this bench's model writes no summaries)."
_SPACE = re.compile(r"\s+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def fold(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def sentences(text: str) -> list[str]:
    return [fold(s) for s in _SENTENCE.split(text) if len(fold(s)) >= 3]


class Script:
    """The fake model's side: recorded answers for chat turns, empty results for memory's own calls."""

    def __init__(self) -> None:
        self.next_answer = NO_ANSWER
        self.chat_requests: list[dict[str, Any]] = []

    def __call__(self, api: str, body: dict[str, Any]) -> FakeReply:
        system = _system_text(body)
        if system.startswith(CONSOLIDATION_SYSTEM[:60]):
            return FakeReply(text=EMPTY_CONSOLIDATION)
        if system.startswith(SUMMARY_SYSTEM[:60]):
            return FakeReply(text=EMPTY_SUMMARY)
        self.chat_requests.append(body)
        return FakeReply(text=self.next_answer)


def _system_text(body: dict[str, Any]) -> str:
    for message in body.get("messages", []):
        if message.get("role") == "system":
            return _content_text(message.get("content"))
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def conversation(turns: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(user message, recorded answer) pairs: consecutive turns of one role joined, empty ones dropped."""
    merged: list[tuple[str, str]] = []
    for turn in turns:
        role, text = str(turn.get("role")), str(turn.get("content") or "").strip()
        if role not in ("user", "assistant") or not text:
            continue
        if merged and merged[-1][0] == role:
            merged[-1] = (role, f"{merged[-1][1]}\n\n{text}")
        else:
            merged.append((role, text))
    if merged and merged[0][0] == "assistant":
        merged.insert(0, ("user", OPENER))
    pairs: list[tuple[str, str]] = []
    for i, (role, text) in enumerate(merged):
        if role == "user":
            answer = merged[i + 1][1] if i + 1 < len(merged) else NO_ANSWER
            pairs.append((text, answer))
    return pairs


def sections_of(system: str) -> list[tuple[str, str]]:
    """The system prompt cut at its ``## `` headings: (heading, folded text)."""
    out: list[tuple[str, str]] = []
    current, lines = "system prompt", []
    for line in system.splitlines():
        if line.startswith("## "):
            out.append((current, fold("\n".join(lines))))
            current, lines = line[3:].strip(), []
        else:
            lines.append(line)
    out.append((current, fold("\n".join(lines))))
    return out


def locate(turn_text: str, places: list[tuple[str, str]]) -> tuple[str, float]:
    """Where the whole turn is (a section name, or "split"/"missing") and the share of its sentences found."""
    whole = fold(turn_text)
    for name, text in places:
        if whole and whole in text:
            return name, 1.0
    everything = "\n".join(text for _, text in places)
    parts = sentences(turn_text) or [whole]
    share = sum(1 for s in parts if s in everything) / len(parts)
    return ("split" if share == 1.0 else "missing"), share


async def run_question(
    q: dict[str, Any],
    counter: TokenCounter,
    dump: Path | None = None,
    memory: dict[str, Any] | None = None,
    embedder: Any = None,
) -> dict[str, Any]:
    script = Script()
    fed_ms: list[float] = []
    with tempfile.TemporaryDirectory(prefix="membot-e2e-") as tmp:
        async with FakeLLMServer() as server:
            server.responder = script
            settings = load_settings(
                env_file=None,
                overrides={
                    "workspace": Path(tmp) / "ws",
                    "llm": {"openai": {"base_url": server.openai_base_url, "api_key": "sk-bench"}},
                    **({"memory": memory} if memory else {}),
                },
            )
            async with build_core(settings, embedder=embedder) as core:
                channel = BenchChannel(core.dispatcher.submit)
                core.dispatcher.attach(channel)

                async def say(text: str, when: datetime) -> None:
                    started = time.perf_counter()
                    await core.dispatcher.submit(
                        InboundMessage("bench", "chat", "user", text, timestamp=when)
                    )
                    await channel.arrived.get()
                    fed_ms.append((time.perf_counter() - started) * 1000)

                order = sorted(
                    zip(q["haystack_dates"], q["haystack_sessions"], strict=True),
                    key=lambda pair: parse_date(str(pair[0]), UTC),
                )
                for date, turns in order:
                    start = parse_date(str(date), UTC)
                    for i, (text, answer) in enumerate(conversation(turns)):
                        script.next_answer = answer
                        await say(text, start + timedelta(seconds=30 * i))
                    await core.dispatcher.submit(
                        InboundMessage("bench", "chat", "user", "/new", timestamp=start)
                    )
                    await channel.arrived.get()
                if core.memory.vectors is not None:  # days later, everything said was embedded
                    await core.memory.vectors.drain()
                asked = parse_date(str(q["question_date"]), UTC)
                script.next_answer = NO_ANSWER
                before = len(script.chat_requests)
                await core.dispatcher.submit(
                    InboundMessage("bench", "chat", "user", str(q["question"]), timestamp=asked)
                )
                await channel.arrived.get()
            requests = script.chat_requests[before:]
    request = requests[0] if requests else {"messages": []}
    system = _system_text(request)
    history = [
        _content_text(m.get("content")) for m in request.get("messages", []) if m.get("role") != "system"
    ]
    places = [*sections_of(system), ("history", fold("\n".join(history)))]
    evidence: list[dict[str, Any]] = []
    for sid, turns in zip(q["haystack_session_ids"], q["haystack_sessions"], strict=True):
        for i, turn in enumerate(turns):
            if turn.get("has_answer"):
                where, share = locate(str(turn.get("content") or ""), places)
                evidence.append({"session_id": sid, "turn": i, "role": turn.get("role"), "where": where,
                                 "sentences": round(share, 3)})  # fmt: skip
    prompt_text = system + "\n" + "\n".join(history)
    tools = request.get("tools") or []
    tools_json = json.dumps(tools, ensure_ascii=False, separators=(",", ":")) if tools else ""
    tool_tokens = counter.count_text(tools_json)
    if dump is not None:
        (dump / f"{q.get('question_id')}.txt").write_text(prompt_text, encoding="utf-8")
    return {
        "question_id": q.get("question_id"),
        "question_type": q.get("question_type", "unknown"),
        "evidence": evidence,
        "prompt_tokens": counter.count_text(prompt_text) + 4 * len(request.get("messages", [])),
        "tool_tokens": tool_tokens,
        "fed_ms": fed_ms,
    }


def _worker(job: tuple[dict[str, Any], Path | None, dict[str, Any], Path | None]) -> dict[str, Any]:
    q, dump, memory, cache = job
    embedder = _worker_embedder(memory, cache)
    result = asyncio.run(run_question(q, _worker_counter(), dump, memory, embedder))
    if embedder is not None:
        embedder.save()
    return result


_EMBEDDER: Any = None


def _worker_embedder(memory: dict[str, Any], cache: Path | None) -> Any:
    """One embedder per worker process that embeds each distinct text once (haystacks share most of
    their sessions); with ``--embedding-cache`` it also reads the cache and saves its own shard."""
    global _EMBEDDER
    if memory.get("embeddings", "local") == "none":
        return None
    if _EMBEDDER is None:
        from bench.embedding_cache import CachedEmbedder
        from bot.config import MemorySettings
        from bot.memory.embeddings import build_embedder

        inner = build_embedder(MemorySettings(**memory))
        shard = cache.with_name(f"{cache.stem}.{os.getpid()}.npz") if cache else None
        _EMBEDDER = CachedEmbedder(inner, cache, save_to=shard)
    return _EMBEDDER


_COUNTER: TokenCounter | None = None


def _worker_counter() -> TokenCounter:
    global _COUNTER
    if _COUNTER is None:
        configure_logging(level="ERROR", fmt="json")
        _COUNTER = TokenCounter.offline(model="gpt-4.1-mini", provider="openai")
    return _COUNTER


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))] if ordered else 0.0


def report(results: list[dict[str, Any]], elapsed: float) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        groups["ALL"].append(r)
        groups[str(r["question_type"])].append(r)
    print(
        "\nprompt tokens (tok): system prompt + messages of the question's request; +tools: the tool "
        "definitions sent with it (tools JSON); ms/msg: time per fed message"
    )
    print(f"{'question type':<28}{'n':>4}{'evidence':>10}{'reach':>8}{'all-ev q':>10}{'partial':>9}"
          f"{'tok med':>9}{'tok p95':>9}{'+tools':>8}{'ms/msg med':>12}{'ms/msg p95':>12}")  # fmt: skip
    summary: dict[str, Any] = {}
    for name in ["ALL", *sorted(k for k in groups if k != "ALL")]:
        rows = groups[name]
        ev = [e for r in rows for e in r["evidence"]]
        reached = sum(1 for e in ev if e["where"] not in ("missing",))
        partial = sum(1 for e in ev if e["where"] == "missing" and e["sentences"] >= 0.5)
        with_ev = [r for r in rows if r["evidence"]]
        all_q = sum(1 for r in with_ev if all(e["where"] != "missing" for e in r["evidence"]))
        tokens = [float(r["prompt_tokens"]) for r in rows]
        fed_ms = [ms for r in rows for ms in r["fed_ms"]]
        tools = statistics.median(float(r.get("tool_tokens", 0)) for r in rows)
        reach = reached / len(ev) if ev else 0.0
        all_share = all_q / len(with_ev) if with_ev else 0.0
        print(f"{name:<28}{len(rows):>4}{len(ev):>10}{reach:>8.3f}{all_share:>10.3f}"
              f"{partial / len(ev) if ev else 0.0:>9.3f}{statistics.median(tokens):>9.0f}"
              f"{percentile(tokens, 0.95):>9.0f}{tools:>8.0f}{statistics.median(fed_ms) if fed_ms else 0.0:>12.1f}"
              f"{percentile(fed_ms, 0.95):>12.1f}")  # fmt: skip
        summary[name] = {"reach": reach, "all_evidence": all_share, "n": len(rows)}
    places = Counter(e["where"] for r in results for e in r["evidence"])
    print("\nwhere the evidence was found: " + ", ".join(f"{k} {v}" for k, v in places.most_common()))
    fed = [ms for r in results for ms in r["fed_ms"]]
    print(f"per fed message: median {statistics.median(fed) if fed else 0.0:.1f} ms, p95 {percentile(fed, 0.95):.1f} ms "
          f"over {len(fed)} messages; wall time {elapsed / 60:.1f} min")  # fmt: skip
    tokens = [float(r["prompt_tokens"]) for r in results]
    all_ = summary["ALL"]
    print(f"\ntargets: evidence reach {all_['reach']:.3f} (>= 0.90; retrieval issue: >= 0.95), questions with all evidence "
          f"{all_['all_evidence']:.3f} (>= 0.80), median prompt {statistics.median(tokens):.0f} tokens "
          f"(<= 4000)")  # fmt: skip
    return summary


def load_questions(path: Path, only: set[str] | None, limit: int | None) -> list[dict[str, Any]]:
    data = read_json(path)
    questions = data if isinstance(data, list) else [data]
    out = []
    for i, q in enumerate(questions):
        if not isinstance(q, dict) or "haystack_sessions" not in q or "question" not in q:
            raise ConfigError(f"question #{i} is not a LongMemEval question (haystack_sessions, question)")
        q = {"question_id": f"q{i}", "question_date": q.get("haystack_dates", [""])[-1], **q}
        if only is None or str(q["question_id"]) in only:
            out.append(q)
    return out[:limit] if limit else out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_data_arguments(parser, DEFAULT_DATA)
    parser.add_argument("--limit", type=int, default=None, help="only the first N questions")
    parser.add_argument("--only", default=None, help="comma-separated question ids")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="questions run in parallel")
    parser.add_argument("--out", type=Path, default=None, help="one JSON line per question")
    parser.add_argument(
        "--dump", type=Path, default=None, help="write each question's prompt to DIR/<id>.txt"
    )
    parser.add_argument(
        "--embedding-cache",
        type=Path,
        default=None,
        help="remember vectors by text across runs (.npz; same figures, the model's time left out)",
    )
    parser.add_argument(
        "--embeddings", choices=["default", "none", "local"], default="default", help="memory.embeddings"
    )
    args = parser.parse_args()
    args.data = data_of(args)
    try:
        only = set(args.only.split(",")) if args.only else None
        questions = load_questions(args.data, only, args.limit)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    progress = Progress(*Progress.get_default_columns(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)  # fmt: skip
    out = args.out.open("w", encoding="utf-8") if args.out else None
    run: Callable[[Any], Any]
    with progress:
        task = progress.add_task("questions", total=len(questions))
        if args.jobs > 1:
            pool = multiprocessing.get_context("spawn").Pool(args.jobs)
            run = pool.imap_unordered
        else:
            pool, run = None, map
        try:
            if args.dump is not None:
                args.dump.mkdir(parents=True, exist_ok=True)
            memory = {} if args.embeddings == "default" else {"embeddings": args.embeddings}
            for result in run(_worker, [(q, args.dump, memory, args.embedding_cache) for q in questions]):
                results.append(result)
                if out is not None:
                    out.write(json.dumps({k: v for k, v in result.items() if k != "fed_ms"}) + "\n")
                    out.flush()
                progress.advance(task)
        finally:
            if pool is not None:
                pool.close()
                pool.join()
            if out is not None:
                out.close()
    print(f"{len(results)} questions from {args.data.name}; default settings, embeddings {args.embeddings}")
    report(results, time.perf_counter() - started)


if __name__ == "__main__":
    main()
