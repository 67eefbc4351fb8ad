"""MEMORY.md: live re-read of operator edits, compare-and-swap, and the merge that favours the operator."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bot.memory.longterm import Conflict, LongTermMemory, content_hash, merge_lines


async def test_operator_edit_is_seen_on_next_read(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    memory = LongTermMemory(path)
    assert (await memory.read()).text == ""
    path.write_text("- first\n")
    assert (await memory.read()).text == "- first\n"
    path.write_text("- second, same size\n"[:8] + "\n")
    os.utime(path, ns=(1, 1))  # even a different mtime in the past counts as a change
    assert (await memory.read()).text == "- second\n"


async def test_write_refuses_when_file_changed_since_read(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    memory = LongTermMemory(path)
    snap = await memory.write("- bot\n", expected=content_hash(""))
    path.write_text("- operator\n")
    with pytest.raises(Conflict):
        await memory.write("- bot again\n", expected=snap.hash)
    assert path.read_text() == "- operator\n"


async def test_replace_from_merges_on_conflict(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    memory = LongTermMemory(path)
    base = await memory.write("- a\n- b\n", expected=content_hash(""))
    path.write_text("- a\n- b\n- operator line\n")
    snap, merged = await memory.replace_from(base, "- a\n- c\n")
    assert merged and snap.text == "- a\n- operator line\n- c\n"


async def test_every_version_a_bot_write_replaced_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    memory = LongTermMemory(path)
    first = await memory.write("- likes tea\n", expected=content_hash(""))  # nothing replaced yet
    assert not memory.replaced_path.exists()
    path.write_text("- likes tea\n- operator: born in Lyon\n")
    await memory.update(lambda text: "- likes coffee now\n")  # a careless consolidation
    kept = memory.replaced_path.read_text()
    assert "- operator: born in Lyon" in kept and "replaced by the bot" in kept
    assert first.text not in path.read_text()
    await memory.update(lambda text: text + "- third\n")
    versions = memory.replaced_path.read_text().split("## ")[1:]
    assert len(versions) == 2 and "- likes coffee now" in versions[1]
    assert oct(memory.replaced_path.stat().st_mode & 0o777) == "0o600"


async def test_written_file_is_private(tmp_path: Path) -> None:
    memory = LongTermMemory(tmp_path / "MEMORY.md")
    await memory.update(lambda _: "- x\n")
    assert (tmp_path / "MEMORY.md").stat().st_mode & 0o777 == 0o600


def test_merge_keeps_operator_changes() -> None:
    base = "# Facts\n- likes tea\n- lives in Rome\n"
    ours = "# Facts\n- likes tea\n- lives in Milan\n"
    theirs = "# Facts\n- likes green tea\n- lives in Rome\n- allergic to nuts\n"
    assert (
        merge_lines(base, ours, theirs)
        == "# Facts\n- likes green tea\n- allergic to nuts\n- lives in Milan\n"
    )
