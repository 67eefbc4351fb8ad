"""Markdown tables as aligned code blocks, for chats that show no tables (Discord)."""

from __future__ import annotations

from channels.tables import tables_as_code

TABLE = "| Item | Price |\n|---|---:|\n| **Tea** | 3 |\n| Coffee \\| cake | 4.50 |"


def test_a_table_becomes_an_aligned_code_block_and_the_rest_stays() -> None:
    assert tables_as_code(f"Prices:\n\n{TABLE}\n\nDone.") == (
        "Prices:\n\n```\nItem          | Price\n--------------+------\nTea           | 3\n"
        "Coffee | cake | 4.50\n```\n\nDone."
    )


def test_pipes_that_are_no_table_are_left_as_they_are() -> None:
    fenced = f"```\n{TABLE}\n```"
    assert tables_as_code(fenced) == fenced  # code is shown as written
    for text in ("a | b", "| just one line |", "| a | b |\nno rule under it"):
        assert tables_as_code(text) == text
