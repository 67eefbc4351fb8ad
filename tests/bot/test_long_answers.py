"""The bound on an answer's length (bot/long_answers.py)."""

from __future__ import annotations

from bot.long_answers import bounded


def test_a_long_answer_is_cut_at_a_break_with_its_code_block_closed() -> None:
    text = "intro\n\n```python\n" + "x = 1\n" * 1000
    cut = bounded(text, 1_000)
    assert len(cut) <= 1_000 and bounded(cut, 1_000) == cut  # bounded again: unchanged
    assert cut.endswith("x = 1\n```\n\n… (the answer was cut here: it was longer than 1,000 characters)")
    assert bounded("short", 1_000) == "short"
