"""The held-out memory set: its hand-written cases keep their rules, and the built file is a LongMemEval
file the memory benches read (``--data``)."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench.heldout_build import OPEN_SUBSET, SOURCE, check_case, parse
from tests.bench.runner import run_bench

TYPES = {
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "multi-session",
    "temporal-reasoning",
    "knowledge-update",
}
needs_open_subset = pytest.mark.skipif(not OPEN_SUBSET.exists(), reason="../shared/bench is not present")


def test_the_cases_follow_their_rules() -> None:
    cases = json.loads(SOURCE.read_text(encoding="utf-8"))["cases"]
    for case in cases:
        check_case(case)
    answered = [c for c in cases if not c["question_id"].endswith("_abs")]
    assert len(answered) >= 40 and len(cases) - len(answered) >= 3
    assert set(Counter(c["question_type"] for c in cases)) == TYPES
    assert len({c["question_id"] for c in cases}) == len(cases)
    for case in answered:
        for session in case["sessions"]:
            assert 4 <= len(session["turns"]) <= 12, session["id"]
        if case["question_type"] == "multi-session":
            with_evidence = [s for s in case["sessions"] if any(t["has_answer"] for t in s["turns"])]
            assert 2 <= len(with_evidence) <= 3, case["question_id"]


def test_a_broken_case_is_named() -> None:
    case: dict[str, Any] = {
        "question_id": "ho_x",
        "question_date": "2024/01/02 (Tue) 10:00",
        "sessions": [
            {
                "id": "answer_ho_x_1",
                "date": "2024/01/01 (Mon) 10:00",
                "turns": [{"role": "user", "content": "hi", "has_answer": False}],
            }
        ],
    }
    with pytest.raises(ValueError, match="ho_x: no turn is marked has_answer"):
        check_case(case)
    case["sessions"][0]["date"] = "2024/01/03 (Wed) 10:00"
    with pytest.raises(ValueError, match="is not before the question"):
        check_case(case)


@needs_open_subset
def test_builds_a_longmemeval_file_the_same_every_time(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    for out in (first, second):
        result = run_bench("heldout_build.py", "--out", out)
        assert result.returncode == 0, result.stderr
    assert first.read_bytes() == second.read_bytes()
    with gzip.open(first, "rt", encoding="utf-8") as f:
        questions = json.load(f)
    with gzip.open(OPEN_SUBSET, "rt", encoding="utf-8") as f:
        open_ids = {q["question_id"] for q in json.load(f)}
    for q in questions:
        ids, dates, sessions = q["haystack_session_ids"], q["haystack_dates"], q["haystack_sessions"]
        assert len(ids) == len(dates) == len(sessions) and 40 <= len(ids) <= 50, q["question_id"]
        assert q["question_id"].startswith("ho_") and q["question_id"] not in open_ids
        assert q["question_type"] in TYPES
        when = [parse(d) for d in dates]
        assert when == sorted(when) and when[-1] < parse(q["question_date"])
        assert set(q["answer_session_ids"]) <= set(ids)
        for sid, turns in zip(ids, sessions, strict=True):
            marked = any(t.get("has_answer") for t in turns)
            assert not marked or sid in q["answer_session_ids"], (q["question_id"], sid)


@needs_open_subset
def test_the_recall_bench_reads_it_with_data(tmp_path: Path) -> None:
    data = tmp_path / "heldout.json.gz"
    assert run_bench("heldout_build.py", "--out", data).returncode == 0
    result = run_bench("memory_recall.py", "--data", data, "--limit", "2", "--out", tmp_path / "r.jsonl")
    assert result.returncode == 0, result.stderr
    assert "2 questions, 2 scored" in result.stdout
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [x["question_id"] for x in lines] == ["ho_ssu_bird", "ho_ssu_commute"]
