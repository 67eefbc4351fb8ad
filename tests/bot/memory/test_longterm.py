"""MEMORY.md: live re-read of operator edits, compare-and-swap, and the merge that favours the operator."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from bot.memory import exchange
from bot.memory.longterm import (
    Conflict,
    Limits,
    LongTermMemory,
    MemoryFull,
    NotUtf8,
    ReadOnly,
    merge_lines,
)
from bot.memory.longterm_read import content_hash


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


async def test_a_file_saved_in_another_encoding_is_shown_but_never_written(tmp_path: Path) -> None:
    """A bot write would keep U+FFFD where each accented letter was, with no backup of the bytes."""
    path = tmp_path / "MEMORY.md"
    latin1 = "- José Müller lives in Zürich\n".encode("latin-1")
    path.write_bytes(latin1)
    memory = LongTermMemory(path)

    with capture_logs() as logs:
        shown = await memory.read()
        with pytest.raises(NotUtf8, match=r"not UTF-8 text .* Ask the operator to save it as UTF-8"):
            await memory.update(lambda text: text + "- likes tea\n")

    assert shown.text == "- Jos\ufffd M\ufffdller lives in Z\ufffdrich\n"
    assert path.read_bytes() == latin1 and not (tmp_path / "MEMORY.replaced.md").exists()
    assert [e["event"] for e in logs] == ["memory_file_not_utf8", "memory_file_not_utf8"]
    path.write_text("- José Müller lives in Zürich\n")  # saved again as UTF-8: written as usual
    await memory.update(lambda text: text + "- likes tea\n")
    assert path.read_text() == "- José Müller lives in Zürich\n- likes tea\n"


async def test_a_file_grown_past_its_limit_is_logged_and_left_as_it_is(tmp_path: Path) -> None:
    """A paste gone wrong (a whole log) makes MEMORY.md huge: the prompt shows only its start, and the
    operator must hear of it in the log, once per change, not find out from the bot's answers."""
    path = tmp_path / "MEMORY.md"
    huge = "- a line of a pasted log\n" * 10_000  # 250 KB, over the 64 KB limit
    path.write_text(huge)
    memory = LongTermMemory(path)

    with capture_logs() as logs:
        assert (await memory.read()).text == huge
        await memory.read()
        with pytest.raises(MemoryFull):
            await memory.update(lambda text: text + "- likes tea\n")

    assert path.read_text() == huge
    [event] = [e for e in logs if e["event"] == "memory_file_over_limit"]
    assert event["bytes"] == len(huge) and event["limit"] == 65_536


async def test_a_symlinked_file_is_written_where_it_points_and_stays_a_link(tmp_path: Path) -> None:
    """MEMORY.md kept in a dotfiles folder: every write stalled 5 s and failed, and a swap of the link's
    own name would have replaced the link with a file."""
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir(mode=0o755)
    dotfiles.chmod(0o755)
    (dotfiles / "MEMORY.md").write_text("- operator fact\n")
    path = tmp_path / "memory" / "MEMORY.md"
    path.parent.mkdir()
    path.symlink_to(dotfiles / "MEMORY.md")
    memory = LongTermMemory(path)

    await memory.update(lambda text: text + "- likes tea\n")
    with (dotfiles / "MEMORY.md").open("a") as editor:
        editor.write("- operator fact two\n")

    assert path.is_symlink() and path.resolve() == dotfiles / "MEMORY.md"
    assert (await memory.read()).text == "- operator fact\n- likes tea\n- operator fact two\n"
    assert dotfiles.stat().st_mode & 0o777 == 0o755  # not the bot's folder: its mode is left alone


async def test_replace_from_merges_on_conflict(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    memory = LongTermMemory(path)
    base = await memory.write("- a\n- b\n", expected=content_hash(""))
    path.write_text("- a\n- b\n- operator line\n")
    snap, merged = await memory.replace_from(base, "- a\n- c\n")
    assert merged and snap.text == "- a\n- operator line\n- c\n"


async def test_every_line_a_bot_write_removes_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    memory = LongTermMemory(path)
    await memory.write("- likes tea\n", expected=content_hash(""))  # nothing replaced yet
    assert not memory.replaced_path.exists()
    path.write_text("- likes tea\n- operator: born in Lyon\n")
    await memory.update(lambda text: "- likes coffee now\n")  # a careless consolidation
    kept = memory.replaced_path.read_text()
    assert "- operator: born in Lyon\n" in kept and "- likes tea\n" in kept and "removed by the bot" in kept
    await memory.update(lambda text: text + "- third\n")  # removes nothing: nothing to keep
    assert memory.replaced_path.read_text() == kept
    await memory.update(lambda text: "- third\n")
    blocks = memory.replaced_path.read_text().split("## ")[1:]
    assert len(blocks) == 2 and blocks[1].endswith("\n\n- likes coffee now\n\n")
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


def _operator_save(path: Path, style: str, line: str) -> None:
    """An editor's save, the three ways editors do it."""
    if style == "append":
        with open(path, "a") as f:
            f.write(line)
    elif style == "rewrite":
        text = path.read_text()
        with open(path, "w") as f:
            f.write(text + line)
    else:
        text = path.read_text()
        tmp = path.with_name("MEMORY.md.swp")
        tmp.write_text(text + line)
        os.replace(tmp, path)


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "plain-rename"])
@pytest.mark.parametrize("style", ["append", "rewrite", "rename"])
async def test_a_save_between_the_bots_read_and_its_swap_is_merged(
    tmp_path: Path, style: str, exchange: bool
) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_text("- old fact\n- stale fact\n")
    memory = LongTermMemory(path, exchange=exchange)
    saved: list[str] = []

    def consolidation(text: str) -> str:
        if not saved:  # the operator saves right after the bot read the file
            _operator_save(path, style, "- operator: born in Lyon\n")
            saved.append(style)
        return text.replace("- stale fact\n", "") + "- bot: moved to Porto\n"

    snap = await memory.update(consolidation)

    lines = snap.text.splitlines()
    assert "- operator: born in Lyon" in lines and "- bot: moved to Porto" in lines
    assert "- stale fact" not in lines and path.read_text() == snap.text
    assert "- stale fact" in memory.replaced_path.read_text()


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "plain-rename"])
async def test_a_late_write_into_the_displaced_version_is_merged_on_the_next_read(
    tmp_path: Path, exchange: bool
) -> None:
    """An editor opened the file before the bot's swap and writes after it: into the old version."""
    path = tmp_path / "MEMORY.md"
    path.write_text("- likes tea\n")
    memory = LongTermMemory(path, exchange=exchange)
    with open(path, "a") as editor:  # the editor, another program, had the file open
        await memory.update(lambda text: text + "- bot fact\n")
        editor.write("- operator: allergic to nuts\n")
    assert "allergic" not in path.read_text()  # it went into the version that lost its name

    lines = (await memory.read()).text.splitlines()

    assert lines == ["- likes tea", "- bot fact", "- operator: allergic to nuts"]
    assert path.read_text().splitlines() == lines


async def test_a_late_write_whose_merge_hits_a_full_disk_is_merged_once_there_is_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The editor rewrote the displaced version in place (the blocks it freed took its save); the merge
    needs new room and the disk has none. The operator's change must wait for room, not be dropped."""
    path = tmp_path / "MEMORY.md"
    path.write_text("- likes tea\n")
    memory = LongTermMemory(path)
    with open(path, "r+") as editor:  # the editor, another program, had the file open
        await memory.update(lambda text: text + "- bot fact\n")
        editor.truncate(0)
        editor.write("- likes coffee\n")
    full, real = [True], os.write

    def write(fd: int, data: bytes) -> int:
        if full[0] and os.readlink(f"/proc/self/fd/{fd}") == str(memory.replaced_path):
            raise OSError(28, "No space left on device")  # (at the system call: our code runs as it would)
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(OSError, match="No space"):
        await memory.read()
    full[0] = False

    lines = (await memory.read()).text.splitlines()

    assert lines == ["- bot fact", "- likes coffee"]
    assert path.read_text().splitlines() == lines


def test_exchange_if_checks_before_and_after(tmp_path: Path) -> None:
    if not exchange.AVAILABLE:
        pytest.skip("renameat2/statx are Linux-only")
    path, tmp = tmp_path / "MEMORY.md", tmp_path / "new.tmp"
    tmp.write_text("new")
    assert exchange.exchange_if(str(tmp), path, None) == (exchange.Outcome.MISSING, None)
    path.write_text("old")
    stamp = _stamp(path)
    assert exchange.exchange_if(str(tmp), path, None) == (exchange.Outcome.MOVED, None)
    path.write_text("older but changed")
    assert exchange.exchange_if(str(tmp), path, stamp) == (exchange.Outcome.MOVED, None)
    assert path.read_text() == "older but changed" and tmp.read_text() == "new"
    assert exchange.exchange_if(str(tmp), path, _stamp(path)) == (exchange.Outcome.SWAPPED, None)
    assert path.read_text() == "new" and tmp.read_text() == "older but changed"


def _stamp(path: Path) -> tuple[int, int, int]:
    info = path.stat()
    return info.st_ino, info.st_size, info.st_mtime_ns


async def test_the_backup_of_removed_lines_stays_bounded_and_rotates(tmp_path: Path) -> None:
    """It used to copy the whole file on every bot write: 17 MB after 500 writes."""
    path = tmp_path / "MEMORY.md"
    path.write_text("".join(f"- operator fact {i}: " + "x" * 60 + "\n" for i in range(100)))
    memory = LongTermMemory(path, limits=Limits(replaced_max_bytes=8_000))
    with capture_logs() as logs:
        for i in range(300):  # each write adds one fact and drops the oldest line
            await memory.update(
                lambda text, i=i: "".join(text.splitlines(keepends=True)[1:]) + f"- bot fact {i}\n"
            )
    replaced, rotated = memory.replaced_path, memory.replaced_path.with_name("MEMORY.replaced.1.md")
    assert replaced.stat().st_size <= 8_000 and rotated.stat().st_size <= 8_000
    kept = rotated.read_text() + replaced.read_text()
    assert "- bot fact 199\n" in kept and "- bot fact 150\n" in kept  # the newest removals are all there
    assert "- operator fact 0:" not in path.read_text()
    assert oct(rotated.stat().st_mode & 0o777) == "0o600"
    dropped = [e for e in logs if e["event"] == "memory_backup_rotated"]
    assert dropped and all(e["log_level"] == "warning" for e in dropped)  # an older part went: said so


async def test_adding_lines_keeps_nothing_in_the_backup(tmp_path: Path) -> None:
    path = tmp_path / "MEMORY.md"
    path.write_text("- operator: " + "y" * 5000 + "\n")
    memory = LongTermMemory(path)
    for i in range(50):
        await memory.update(lambda text, i=i: text + f"- bot fact {i}\n")
    assert not memory.replaced_path.exists()


async def test_a_file_the_operator_made_read_only_is_not_written_by_the_bot(tmp_path: Path) -> None:
    """``chmod a-w MEMORY.md``: the operator froze the file. A bot write swapped a new file (0600) in
    over it all the same, the read-only mode gone with it (a rename needs no write permission on the
    file, and root needs none at all)."""
    path = tmp_path / "MEMORY.md"
    path.write_text("- operator fact\n")
    memory = LongTermMemory(path)
    assert (await memory.read()).writable  # read (and cached) while still writable
    os.chmod(path, 0o444)

    with capture_logs() as logs:
        shown = await memory.read()
        with pytest.raises(ReadOnly, match=r"read-only .* not changed"):
            await memory.update(lambda text: text + "- likes tea\n")

    assert shown.text == "- operator fact\n" and not shown.writable
    assert path.read_text() == "- operator fact\n" and path.stat().st_mode & 0o777 == 0o444
    [logged] = [e for e in logs if e["event"] == "memory_file_read_only"]
    assert f"chmod u+w {path}" in logged["hint"]
    os.chmod(path, 0o644)  # writable again: written as usual
    await memory.update(lambda text: text + "- likes tea\n")
    assert path.read_text() == "- operator fact\n- likes tea\n"


async def test_a_bot_write_keeps_the_files_line_endings_and_byte_order_mark(tmp_path: Path) -> None:
    """Saved by a Windows editor (CRLF, a BOM) or checked out by git with autocrlf: every bot write
    turned the whole file into LF lines without the BOM (a diff of every line in the operator's
    repository), and a merge of their edit the same."""
    path = tmp_path / "MEMORY.md"
    path.write_bytes("\ufeff# Facts\r\n- likes tea\r\n".encode())
    memory = LongTermMemory(path)

    await memory.update(lambda text: text.rstrip() + "\n- born in Lyon\n")
    assert path.read_bytes() == "\ufeff# Facts\r\n- likes tea\r\n- born in Lyon\r\n".encode()
    base = await memory.read()
    path.write_bytes("\ufeff# Facts\r\n- likes tea\r\n- born in Lyon\r\n- operator line\r\n".encode())
    await memory.replace_from(base, "# Facts\n- likes green tea\n- born in Lyon\n")  # (the model's: LF)
    assert (
        path.read_bytes()
        == "\ufeff# Facts\r\n- born in Lyon\r\n- operator line\r\n- likes green tea\r\n".encode()
    )
    assert not memory.replaced_path.read_text().count("# Facts")  # the heading was not removed
