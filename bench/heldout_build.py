"""The held-out memory set: hand-written questions in distractor haystacks from the open subset.

Every ranking weight of membot's memory was chosen on the open LongMemEval subset, so its figures there
flatter the ranking. ``bench/heldout/cases.json`` holds questions written by hand for this project (no
public benchmark's questions): each with its own evidence sessions, facts said in passing and asked
about in other words. This script puts each case's evidence among about 45 sessions of the open
subset that hold no evidence (all from one open question, chosen by the case's index), spreads the
distractors over the months before the question, and writes ``bench/heldout/heldout.json.gz`` in the
LongMemEval format, so the memory benches run on it unchanged:

    python bench/heldout_build.py [--open FILE] [--out FILE]
    python bench/memory_e2e.py --data bench/heldout/heldout.json.gz    # built first when missing
    python bench/memory_recall.py --data bench/heldout/heldout.json.gz

The build is deterministic (same source, same bytes), so figures from two checkouts compare.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "bench" / "heldout" / "cases.json"
OUTPUT = ROOT / "bench" / "heldout" / "heldout.json.gz"
OPEN_SUBSET = ROOT.parent / "shared" / "bench" / "longmemeval_s_100.json.gz"
DISTRACTORS = 45
SPAN = timedelta(days=90)  # distractors fall in the last three months before the question (or earlier)
# Open questions whose evidence was read while writing the cases, to match the format: their haystacks
# are not used, so no distractor shares a topic with what shaped the hand-written cases.
LOOKED_AT = frozenset({"06f04340", "07741c44", "1d4da289", "2a1811e2"})
_DATE = "%Y/%m/%d (%a) %H:%M"


def parse(date: str) -> datetime:
    return datetime.strptime(date, _DATE)


def build_question(index: int, case: dict[str, Any], donors: list[dict[str, Any]]) -> dict[str, Any]:
    """One LongMemEval question: the case's sessions among distractors from one donor question."""
    rng = random.Random(f"heldout-{index}")
    donor = rng.choice(donors)
    pool = [
        (sid, session)
        for sid, session in zip(donor["haystack_session_ids"], donor["haystack_sessions"], strict=True)
        if not sid.startswith("answer_")
    ]
    picked = rng.sample(pool, min(DISTRACTORS, len(pool)))
    asked = parse(case["question_date"])
    evidence = [(parse(s["date"]), s["id"], s["turns"]) for s in case["sessions"]]
    start = min([asked - SPAN, *(when - timedelta(days=7) for when, _, _ in evidence)])
    minutes = int((asked - timedelta(hours=2) - start).total_seconds() // 60)
    sessions = [(start + timedelta(minutes=rng.randrange(minutes)), sid, turns) for sid, turns in picked]
    sessions += evidence
    sessions.sort(key=lambda s: s[0])
    return {
        "question_id": case["question_id"],
        "question_type": case["question_type"],
        "question": case["question"],
        "question_date": case["question_date"],
        "answer": case["answer"],
        "answer_session_ids": [s["id"] for s in case["sessions"]],
        "haystack_dates": [when.strftime(_DATE) for when, _, _ in sessions],
        "haystack_session_ids": [sid for _, sid, _ in sessions],
        "haystack_sessions": [turns for _, _, turns in sessions],
    }


def check_case(case: dict[str, Any]) -> None:
    """The rules the cases are written to; a broken one names the case."""
    qid, sessions = case["question_id"], case["sessions"]
    abstention = qid.endswith("_abs")
    if not qid.startswith("ho_"):
        raise ValueError(f"{qid}: held-out ids start with ho_")
    for s in sessions:
        if not s["id"].startswith("answer_"):
            raise ValueError(f"{qid}: evidence session {s['id']} must start with answer_")
        if parse(s["date"]) >= parse(case["question_date"]):
            raise ValueError(f"{qid}: session {s['id']} is not before the question")
    marked = sum(bool(t.get("has_answer")) for s in sessions for t in s["turns"])
    if abstention and marked:
        raise ValueError(f"{qid}: an abstention case marks no evidence")
    if not abstention and not marked:
        raise ValueError(f"{qid}: no turn is marked has_answer")


def build(source: Path = SOURCE, open_subset: Path = OPEN_SUBSET) -> list[dict[str, Any]]:
    cases = json.loads(source.read_text(encoding="utf-8"))["cases"]
    with gzip.open(open_subset, "rt", encoding="utf-8") as f:
        donors = [q for q in json.load(f) if q["question_id"] not in LOOKED_AT]
    for case in cases:
        check_case(case)
    return [build_question(i, case, donors) for i, case in enumerate(cases)]


def write(questions: list[dict[str, Any]], out: Path) -> None:
    """Gzip'd JSON with no name or time in the header (same questions, same bytes), replaced atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as f:
        f.write(json.dumps(questions, ensure_ascii=False).encode("utf-8"))
    tmp.replace(out)


def add_data_arguments(parser: argparse.ArgumentParser, default: Path) -> None:
    """A memory bench's questions file: ``DATA`` or ``--data FILE`` (read with :func:`data_of`)."""
    parser.add_argument("data", nargs="?", type=Path, default=default)
    parser.add_argument(
        "--data",
        dest="data_option",
        type=Path,
        default=None,
        metavar="FILE",
        help="the questions file (as DATA)",
    )


def data_of(args: argparse.Namespace) -> Path:
    """The questions file :func:`add_data_arguments` named, the held-out set built first if need be."""
    return ensure_built(args.data_option or args.data)


def ensure_built(data: Path) -> Path:
    """``data`` itself; when it is the held-out file and missing or older than its source, build it."""
    if data.resolve() == OUTPUT and (not OUTPUT.exists() or OUTPUT.stat().st_mtime < SOURCE.stat().st_mtime):
        if not OPEN_SUBSET.exists():
            raise SystemExit(f"error: the held-out set needs the open subset at {OPEN_SUBSET}")
        write(build(), OUTPUT)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--open", type=Path, default=OPEN_SUBSET, help="the open LongMemEval subset")
    parser.add_argument("--out", type=Path, default=OUTPUT, help="where to write the held-out set")
    args = parser.parse_args()
    try:
        questions = build(SOURCE, args.open)
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"error: {exc}") from None
    write(questions, args.out)
    sessions = sum(len(q["haystack_sessions"]) for q in questions)
    print(f"{len(questions)} questions, {sessions} sessions -> {args.out}")


if __name__ == "__main__":
    main()
