"""Operator functions behind `membot memory`: import (real write path), search, stats, show."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bot.domain import Message, Role
from bot.errors import ConfigError
from bot.memory import Layer, MemoryService
from bot.memory.importer import parse_date, sessions_from
from bot.memory.operator import import_conversations, memory_file, render_for_session, search, stats
from bot.memory.pending import PENDING_DIR, PendingConsolidations
from bot.memory.prompt import READING_NOTE
from tests.bot.memory.conftest import UTC_ZONE, Clock

LME = [
    {
        "question_id": "q1",
        "haystack_session_ids": ["s_old", "answer_1"],
        "haystack_dates": ["2023/05/20 (Sat) 06:37", "2023/05/21 (Sun) 10:00"],
        "haystack_sessions": [
            [{"role": "user", "content": "Tips for running?"}, {"role": "assistant", "content": "Warm up."}],
            [
                {"role": "assistant", "content": "Welcome back!"},
                {"role": "user", "content": "I adopted a greyhound named Comet."},
                {"role": "assistant", "content": "Lovely!"},
                {"role": "user", "content": "And one more thing."},
            ],
        ],
    }
]


async def test_import_replays_through_the_write_path_with_turn_references(
    memory: MemoryService, tmp_path: Path
) -> None:
    path = tmp_path / "conv.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(LME, f)
    progress: list[tuple[int, int]] = []

    report = await import_conversations(
        memory, path, progress=lambda done, total: progress.append((done, total))
    )

    assert (report.sessions, report.turns) == (2, 6) and progress == [(1, 2), (2, 2)]
    found = await search(memory, "what is my dog called, the greyhound?")
    ref = found[0].item.references[0]
    assert (ref.session_id, ref.turn) == ("answer_1", 1)
    assert (memory.root / "2023-05-21.md").read_text().startswith("[10:00] User: I adopted a greyhound")
    assert (memory.root / "items" / "episodic" / "2023-05-20.jsonl").exists()

    # Running the same import again (say, after Ctrl-C) adds no note lines and no items.
    notes = {p.name: p.read_text() for p in memory.root.glob("2023-*.md")}
    counts = {layer: memory.items.count(layer) for layer in Layer}
    await import_conversations(memory, path)
    assert {p.name: p.read_text() for p in memory.root.glob("2023-*.md")} == notes
    assert {layer: memory.items.count(layer) for layer in Layer} == counts


def test_plain_format_and_dates() -> None:
    data = {
        "sessions": [
            {
                "id": "a",
                "date": "2024-01-02T08:00:00+00:00",
                "turns": [{"role": "user", "content": "x", "timestamp": "2024-01-02T08:05"}],
            }
        ]
    }
    (session,) = sessions_from(data, UTC_ZONE)
    assert session.turns[0].message.timestamp.minute == 5 and session.turns[0].message.id == "a#0"
    assert parse_date("2023/05/30 (Tue) 10:18", UTC_ZONE).hour == 10
    with pytest.raises(ConfigError):
        sessions_from({"nothing": 1}, UTC_ZONE)
    with pytest.raises(ConfigError):
        parse_date("yesterday-ish", UTC_ZONE)


async def test_stats_and_show(memory: MemoryService, clock: Clock) -> None:
    await memory.longterm.update(lambda _: "- likes tea\n")
    history = [Message(Role.USER, "hello there", timestamp=clock.now)]
    prompt = await render_for_session(memory, "You are membot.", history)
    assert prompt.startswith(
        "You are membot.\n\n# Memory\n\nCurrent date and time: 2024-05-20 09:30 (Monday), UTC.\n\n"
        f"{READING_NOTE}\n\n## Long-term Memory\n- likes tea"
    )
    assert memory_file(memory) == memory.root / "MEMORY.md"
    s = await stats(memory)
    assert s.memory_md_bytes == len("- likes tea\n") and s.items == {layer.value: 0 for layer in Layer}
    assert s.last_consolidation is None and s.pending_consolidations == 0


async def test_stats_count_the_consolidations_left_on_disk(memory: MemoryService, clock: Clock) -> None:
    """`membot memory status` runs in its own process: what the bot has not consolidated yet (or a kill
    left for its next start) is counted from the records on disk, not from this process's tasks."""
    left = PendingConsolidations(memory.root / PENDING_DIR)
    await left.add("terminal:me", [Message(Role.USER, "hello there", timestamp=clock.now)], clock.now)
    assert (await stats(memory)).pending_consolidations == 1
