"""The recall bench, run as operators run it: a subprocess on files in the LongMemEval format."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.bench.runner import ROOT, run_bench

SHARED = ROOT.parent / "shared" / "bench" / "longmemeval_s_100.json.gz"


def turn(role: str, content: str, has_answer: bool = False) -> dict[str, Any]:
    return {"role": role, "content": content, "has_answer": has_answer}


def question(qid: str, text: str, **extra: Any) -> dict[str, Any]:
    sessions = {
        "s_weather": [turn("user", "Will it rain in Lisbon tomorrow?"), turn("assistant", "Probably not.")],
        "answer_dog": [
            turn("user", "Hi there"),
            turn("assistant", "Hello!"),
            turn("user", "I adopted a beagle called Rufus from the shelter last week.", True),
            turn("assistant", "Congratulations on Rufus!"),
        ],
        "s_recipe": [turn("user", "Give me a pancake recipe"), turn("assistant", "Flour, eggs, milk.")],
    }
    return {
        "question_id": qid,
        "question_type": "single-session-user",
        "question": text,
        "answer": "a beagle",
        "question_date": "2023/05/30 (Tue) 10:18",
        "haystack_session_ids": list(sessions),
        "haystack_dates": ["2023/05/01 (Mon) 09:00", "2023/05/02 (Tue) 09:00", "2023/05/03 (Wed) 09:00"],
        "haystack_sessions": list(sessions.values()),
        **extra,
    }


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_bench("memory_recall.py", *args)


def write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def all_row(stdout: str, level: str) -> list[float]:
    section = stdout.split(f"{level} level", 1)[1]
    line = next(line for line in section.splitlines() if line.startswith("ALL"))
    return [float(x) for x in line.split()[2:]]


def test_finds_the_evidence_and_writes_ranked_references(tmp_path: Path) -> None:
    data = write(tmp_path / "q.json", [question("q1", "Which dog breed did I adopt?")])
    result = run(data, "--out", tmp_path / "ranked.jsonl", "--k", "3")
    assert result.returncode == 0, result.stderr
    assert "1 questions, 1 scored; returned: top 3; lexical only" in result.stdout
    session_any5, _, _, _, _, _ = all_row(result.stdout, "SESSION")
    turn_any5, turn_all5, *_ = all_row(result.stdout, "TURN")
    assert session_any5 == turn_any5 == turn_all5 == 1.0
    (line,) = (tmp_path / "ranked.jsonl").read_text().splitlines()
    ranked = json.loads(line)
    assert ranked["question_id"] == "q1"
    assert 1 <= len(ranked["ranked"]) <= 3
    assert ranked["ranked"][0] == {"session_id": "answer_dog", "turn": 2}  # index among all turns


def test_budget_mode_abstention_and_gzip_input(tmp_path: Path) -> None:
    payload = [question("q1", "Which dog breed did I adopt?"), question("q2_abs", "What is my cat's name?")]
    data = tmp_path / "q.json.gz"
    with gzip.open(data, "wt", encoding="utf-8") as f:
        json.dump(payload, f)
    result = run(data, "--budget", "200", "--out", tmp_path / "out.jsonl", "--maintain")
    assert result.returncode == 0, result.stderr
    assert "2 questions, 1 scored; returned: budget 200 tokens" in result.stdout
    assert "items maintained at the question date" in result.stdout
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2  # abstentions are ranked, not scored


def test_odd_but_valid_questions_are_accepted(tmp_path: Path) -> None:
    q = question("q1", "Which dog breed did I adopt?")
    for key in ("question_type", "question_date", "answer"):
        del q[key]
    only_abs = question("x_abs", "Anything?")
    result = run(write(tmp_path / "q.json", [q]), "--k", "99")
    assert result.returncode == 0, result.stderr
    assert "returned: top 50" in result.stdout and "unknown" in result.stdout
    result = run(write(tmp_path / "abs.json", only_abs))  # a single object, nothing to score
    assert result.returncode == 0, result.stderr
    assert "1 questions, 0 scored" in result.stdout


@pytest.mark.parametrize(
    "payload, message",
    [
        ({"question_id": "q1", "question": "x"}, "lacks haystack_session_ids"),
        ("not a question", "is not an object"),
    ],
)
def test_malformed_files_get_a_clear_error(tmp_path: Path, payload: Any, message: str) -> None:
    result = run(write(tmp_path / "bad.json", [payload]))
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr
    result = run(tmp_path / "missing.json")
    assert result.returncode != 0 and "cannot read" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/bench is not present")
def test_reads_the_shared_longmemeval_subset(tmp_path: Path) -> None:
    result = run(SHARED, "--limit", "2", "--out", tmp_path / "out.jsonl")
    assert result.returncode == 0, result.stderr
    assert "2 questions" in result.stdout and "retrieval latency median" in result.stdout
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(len(x["ranked"]) == 10 for x in lines)


def test_ablations_and_halves(tmp_path: Path) -> None:
    """The generalization checks: a mechanism turned off by name, and two fixed halves of the questions."""
    questions = [question(f"q{i}", "Which dog breed did I adopt?") for i in range(6)]
    data = write(tmp_path / "q.json", questions)
    result = run(data, "--weights", "hop=0,question=1", "--no-feedback", "--halves")
    assert result.returncode == 0, result.stderr
    assert "changed: hop=0.0, question=1.0, no feedback" in result.stdout
    section = result.stdout.split("TURN level", 1)[1]
    halves = {
        line.split()[1]: int(line.split()[2]) for line in section.splitlines() if line.startswith("half")
    }
    assert set(halves) <= {"a", "b"} and sum(halves.values()) == 6  # every scored question in one half
    again = run(data, "--halves")
    assert again.stdout.split("TURN level", 1)[1].count("half") == section.count("half")  # a fixed split
    for bad, message in (("hopp=1", "no weight 'hopp'"), ("hop", "'hop' is not name=number")):
        result = run(data, "--weights", bad)
        assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr
