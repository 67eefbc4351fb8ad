"""GroupWriter: lines appended without an fsync are written at once and fsynced by the next sync."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bot.group_writer import GroupWriter


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """What the process fsyncs (files and folders), in order."""
    calls: list[Path] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


async def test_an_unsynced_append_is_written_at_once_and_fsynced_by_sync(
    tmp_path: Path, fsynced: list[Path]
) -> None:
    writer, path = GroupWriter(), tmp_path / "items" / "log.jsonl"
    await writer.append(path, b'{"id": "a"}\n', sync=False)
    await writer.append(path, b'{"id": "b"}\n', sync=False)
    assert path.read_bytes() == b'{"id": "a"}\n{"id": "b"}\n'  # readable before any fsync
    assert fsynced == [] and writer.unsynced
    await writer.sync()
    assert fsynced == [path, path.parent]  # the file once; its folder, since the file is new
    assert not writer.unsynced
    await writer.append(path, b'{"id": "c"}\n', sync=False)
    await writer.sync()
    assert fsynced[2:] == [path]  # an existing file: its folder needs no sync


async def test_a_synced_append_covers_the_unsynced_lines_before_it(
    tmp_path: Path, fsynced: list[Path]
) -> None:
    writer, path = GroupWriter(), tmp_path / "log.jsonl"
    path.write_bytes(b"0\n")  # an existing file
    await writer.append(path, b"a\n", sync=False)
    await writer.append(path, b"b\n")
    assert fsynced == [path] and not writer.unsynced
    await writer.sync()
    assert fsynced == [path]  # nothing left to sync


@pytest.fixture
def full_disk_for(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """File names whose writes hit a full disk: the first write takes half its bytes, the next fails
    with ENOSPC, as a disk that fills up mid-append does."""
    names: set[str] = set()
    real = os.write

    def write(fd: int, data: bytes) -> int:
        name = os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1]
        if name not in names:
            return real(fd, data)
        names.discard(name)  # (half now, then full)
        names.add(name + " (full)")
        return real(fd, bytes(data)[: max(1, len(data) // 2)])

    def failing(fd: int, data: bytes) -> int:
        name = os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1]
        if name + " (full)" in names:
            raise OSError(28, "No space left on device")
        return write(fd, data)

    monkeypatch.setattr(os, "write", failing)
    return names


async def test_a_file_the_disk_refuses_fails_only_its_own_callers_and_keeps_none_of_their_lines(
    tmp_path: Path, full_disk_for: set[str]
) -> None:
    """One chat's inbox file on a full disk must not make another chat's line, fsynced in the same
    group, count as not written: its message would be taken again as new, and answered twice."""
    writer, mine, theirs = GroupWriter(), tmp_path / "inbox" / "c1.jsonl", tmp_path / "inbox" / "c2.jsonl"
    await writer.append(theirs, b'{"entry": "earlier"}\n')
    full_disk_for.add("c2.jsonl")
    first = writer.submit(mine, b'{"entry": "hi"}\n')  # one group: both are queued before it runs
    second = writer.submit(theirs, b'{"entry": "yo"}\n' * 50)

    assert await first is None
    with pytest.raises(OSError, match="No space left"):
        await second
    assert mine.read_bytes() == b'{"entry": "hi"}\n'
    assert theirs.read_bytes() == b'{"entry": "earlier"}\n'  # the half written was cut back off
    full_disk_for.clear()
    await writer.append(theirs, b'{"entry": "yo"}\n')  # space is back
    assert theirs.read_bytes() == b'{"entry": "earlier"}\n{"entry": "yo"}\n'


async def test_an_editor_saving_in_place_while_a_line_is_appended_keeps_its_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daily note saved in place (truncate and write: nano, ``cat >``) between the append's look at
    the end and its write: the line goes after the operator's text, not over it."""
    note = tmp_path / "memory" / "2026-03-01.md"
    note.parent.mkdir()
    note.write_text("[09:00] User: hi | Assistant: hello\n")
    edited = "[09:00] User: hi | Assistant: hello\nOPERATOR: the dentist on Friday, important!\n"
    real, saved = os.lseek, []

    def lseek(fd: int, pos: int, how: int) -> int:
        end = real(fd, pos, how)
        if how == os.SEEK_END and not saved:
            saved.append(True)
            with open(note, "r+") as editor:  # the editor saves in place, right now
                editor.truncate(0)
                editor.write(edited)
        return end

    monkeypatch.setattr(os, "lseek", lseek)
    await GroupWriter().append(note, b"[09:05] User: what's up | Assistant: not much\n")

    assert note.read_text() == edited + "[09:05] User: what's up | Assistant: not much\n"


async def test_an_append_that_fails_after_an_editor_saved_in_place_leaves_the_editors_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed append is cut back off the file; a note the operator saved in place between the
    append's write and its failing fsync no longer ends with the append, and must not be cut."""
    note = tmp_path / "memory" / "2026-03-01.md"
    note.parent.mkdir()
    note.write_text("[09:00] User: hi | Assistant: hello\n")
    edited = "[09:00] User: hi | Assistant: hello\nOPERATOR: the dentist on Friday, important!\n"
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(note):
            with open(note, "r+") as editor:  # the editor saves in place, right after our write
                editor.truncate(0)
                editor.write(edited)
            raise OSError(5, "Input/output error")  # and the disk then fails our fsync
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        await GroupWriter().append(note, b"[09:05] User: what's up | Assistant: not much\n")

    assert note.read_text() == edited


async def test_a_synced_append_the_disk_refused_leaves_the_unsynced_lines_before_it_to_sync(
    tmp_path: Path, fsynced: list[Path], full_disk_for: set[str]
) -> None:
    """A synced append that failed fsynced nothing, yet the lines written unsynced before it counted as
    fsynced: ``sync`` passed them over, and the memory write path moved its power-cut marker past them."""
    writer, path = GroupWriter(), tmp_path / "log.jsonl"
    path.write_bytes(b"0\n")  # an existing file
    await writer.append(path, b"a\n", sync=False)
    full_disk_for.add("log.jsonl")
    with pytest.raises(OSError, match="No space left"):
        await writer.append(path, b"b\n" * 50)
    assert writer.unsynced and fsynced == []
    full_disk_for.clear()
    await writer.sync()
    assert fsynced == [path] and not writer.unsynced
    assert path.read_bytes() == b"0\na\n"
