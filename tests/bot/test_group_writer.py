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
