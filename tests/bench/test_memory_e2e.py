"""The end-to-end memory bench, run as operators run it: a subprocess on a file in the LongMemEval format.

The bot is the real one (dispatcher, pipeline, memory) against the bench's fake model server; nothing of
the bot is mocked. Embeddings are off so the run takes seconds.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
from pathlib import Path
from typing import Any

from tests.bench.runner import run_bench

# A row of the per-type table: name, n, evidence, reach, all-ev q, partial, tok med, tok p95, ms/msg med, p95.
NUMBER = r"\s+([\d.]+)"
ROW = re.compile(rf"^(\S+){NUMBER * 10}\s*$", re.M)


def turn(role: str, content: str, has_answer: bool = False) -> dict[str, Any]:
    return {"role": role, "content": content, "has_answer": has_answer}


def question(qid: str, qtype: str, text: str, sessions: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    dates = ["2023/05/01 (Mon) 09:00", "2023/05/02 (Tue) 09:00", "2023/05/03 (Wed) 09:00"]
    return {
        "question_id": qid,
        "question_type": qtype,
        "question": text,
        "answer": "-",
        "question_date": "2023/05/30 (Tue) 10:18",
        "haystack_session_ids": list(sessions),
        "haystack_dates": dates[: len(sessions)],
        "haystack_sessions": list(sessions.values()),
    }


WEATHER = [turn("user", "Will it rain in Lisbon tomorrow?"), turn("assistant", "Probably not.")]
RECIPE = [turn("user", "Give me a pancake recipe"), turn("assistant", "Flour, eggs, milk.")]
DOG = "I adopted a beagle called Rufus from the shelter last week."
VIOLIN = "My violin teacher is called Margarethe Oyelaran."
# A turn of a role the bench never feeds (it sends only user and assistant turns): its text cannot reach
# the prompt, whatever memory does, so the bench must report it missing.
UNSPOKEN = "The secret harbour code is Quillfeather-4471."

QUESTIONS = [
    question(
        "dog",
        "single-session-user",
        "What is the name of the beagle I adopted from the shelter?",
        {
            "s_weather": WEATHER,
            "s_dog": [
                turn("user", "Hi there"),
                turn("assistant", "Hello!"),
                turn("user", DOG, True),
                turn("assistant", "Congratulations on Rufus!"),
            ],
            "s_recipe": RECIPE,
        },
    ),
    question(
        "violin",
        "knowledge-update",
        "What is my violin teacher called?",
        {
            "s_violin": [
                turn("assistant", "Welcome back! How are the lessons going?"),  # the bench adds an opener
                turn("user", VIOLIN, True),
                turn("assistant", "Margarethe sounds like a great teacher."),
            ],
            "s_recipe": RECIPE,
        },
    ),
    question(
        "harbour",
        "temporal-reasoning",
        "What is the secret harbour code?",
        {
            "s_weather": WEATHER,
            "s_harbour": [turn("user", "Let me tell you something."), turn("narrator", UNSPOKEN, True)],
        },
    ),
]


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_bench("memory_e2e.py", *args)


def test_evidence_reach_per_question_and_per_type(tmp_path: Path) -> None:
    data = tmp_path / "q.json.gz"
    with gzip.open(data, "wt", encoding="utf-8") as f:
        json.dump(QUESTIONS, f)
    out = tmp_path / "out.jsonl"
    result = run("--data", data, "--jobs", "1", "--embeddings", "none", "--out", out)
    assert result.returncode == 0, result.stderr
    assert "3 questions from q.json.gz; default settings, embeddings none" in result.stdout

    lines = {x["question_id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert set(lines) == {"dog", "violin", "harbour"}
    for qid, evidence_turn in (("dog", 2), ("violin", 1)):
        (ev,) = lines[qid]["evidence"]
        assert ev["turn"] == evidence_turn and ev["role"] == "user"
        assert ev["where"] != "missing" and ev["sentences"] == 1.0, (qid, ev, result.stdout)
    (ev,) = lines["harbour"]["evidence"]
    assert ev == {
        "session_id": "s_harbour",
        "turn": 1,
        "role": "narrator",
        "where": "missing",
        "sentences": 0.0,
    }
    for line in lines.values():
        assert "fed_ms" not in line
        # The request carries the bot's tools; their JSON is counted apart from the prompt's tokens.
        assert line["tool_tokens"] > 0 and line["prompt_tokens"] > 0

    assert "system prompt + messages of the question's request; +tools" in result.stdout
    assert "ms/msg med" in result.stdout and "ms/msg p95" in result.stdout
    rows = {m.group(1): [float(x) for x in m.groups()[1:]] for m in ROW.finditer(result.stdout)}
    assert set(rows) == {"ALL", "single-session-user", "knowledge-update", "temporal-reasoning"}, (
        result.stdout
    )
    for name, expected in (
        ("ALL", (3, 3, 2 / 3, 2 / 3)),
        ("single-session-user", (1, 1, 1.0, 1.0)),
        ("knowledge-update", (1, 1, 1.0, 1.0)),
        ("temporal-reasoning", (1, 1, 0.0, 0.0)),
    ):
        n, evidence, reach, all_ev, _partial, tok_med, tok_p95, tools, ms_med, ms_p95 = rows[name]
        assert (n, evidence) == expected[:2], name
        assert abs(reach - expected[2]) < 1e-3 and abs(all_ev - expected[3]) < 1e-3, name
        assert 0 < tok_med <= tok_p95 and tools > 0, name
        assert 0 < ms_med <= ms_p95, name
    tokens = sorted(float(x["prompt_tokens"]) for x in lines.values())
    assert rows["ALL"][5:7] == [tokens[1], tokens[2]]  # the table's median and p95 are the lines' figures
    assert re.search(
        r"^per fed message: median [\d.]+ ms, p95 [\d.]+ ms over 9 messages", result.stdout, re.M
    )
    assert "where the evidence was found:" in result.stdout and "missing 1" in result.stdout
