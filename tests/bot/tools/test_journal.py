"""The record of a turn's tool calls: what a rerun of the same turn finds, and what it never does."""

from __future__ import annotations

from pathlib import Path

from bot.tools import ToolJournal

SID, CALL = "telegram:42", ("files", '{"action": "append"}', 1)


async def test_a_rerun_of_the_turn_finds_each_call_by_its_place_among_its_kind(tmp_path: Path) -> None:
    journal = ToolJournal(tmp_path / "tool_calls")
    assert await journal.made(SID, "m1") == {}
    await journal.keep(SID, "m1", CALL, "Appended (first).")
    await journal.keep(SID, "m1", (*CALL[:2], 2), "Appended (second).")
    assert await ToolJournal(tmp_path / "tool_calls").made(SID, "m1") == {
        CALL: "Appended (first).",
        (*CALL[:2], 2): "Appended (second).",
    }
    assert await journal.made("telegram:43", "m1") == {}  # another chat's turn


async def test_another_turn_of_the_chat_starts_afresh_and_drops_the_old_record(tmp_path: Path) -> None:
    journal = ToolJournal(tmp_path / "tool_calls")
    await journal.made(SID, "m1")
    await journal.keep(SID, "m1", CALL, "Appended.")
    assert await journal.made(SID, "m2") == {}
    assert list((tmp_path / "tool_calls").iterdir()) == []
    assert await journal.made(SID, "m1") == {}  # gone: that turn was over


async def test_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    journal = ToolJournal(tmp_path / "tool_calls")
    await journal.keep(SID, "m1", CALL, "Appended.")
    [path] = (tmp_path / "tool_calls").iterdir()
    with path.open("ab") as f:
        f.write(b'{"name": "shell", "argu')  # a kill mid-append
    assert await journal.made(SID, "m1") == {CALL: "Appended."}
