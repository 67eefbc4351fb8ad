"""The Discord seen marks: a damaged file costs only the catch-up, never the start."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from channels.discord.seen import SeenMarks


@pytest.mark.parametrize(
    "damage",
    [
        b'{"newest": {"123": 1e400}}\n',  # valid JSON: Infinity where an id belongs
        b'{"newest": {"123": "not a number"}}\n',
        b'{"newest": [1, 2]}\n',
        b"\xff\xfe not even UTF-8",
    ],
)
async def test_a_damaged_file_is_kept_aside_and_the_channel_starts_without_marks(
    tmp_path: Path, damage: bytes
) -> None:
    path = tmp_path / "discord_seen.json"
    path.write_bytes(damage)
    marks = SeenMarks(path)

    await marks.load()

    assert marks.begin() == {} and not path.exists()
    assert kept_aside(tmp_path) == [damage]  # for the operator


def kept_aside(folder: Path) -> list[bytes]:
    return [p.read_bytes() for p in folder.glob("discord_seen.json.damaged-*")]


async def test_the_connected_point_stays_on_disk_until_a_fresh_sessions_catch_up_ends(tmp_path: Path) -> None:
    path = tmp_path / "discord_seen.json"
    first_start, later = 1_000_000 << 22, 2_000_000 << 22
    marks = SeenMarks(path)
    await marks.load()
    marks.begin()
    marks.connected_through(first_start)
    await marks.close()
    assert on_disk(path) == first_start

    marks = SeenMarks(path)  # the next start: its catch-up has to read the gap after first_start
    await marks.load()
    assert marks.connected_until == first_start
    marks.begin()
    marks.heard(later)  # live events during the catch-up
    await marks.close()  # stopped (or killed) before the catch-up ended: the gap is read again
    assert on_disk(path) == first_start

    marks = SeenMarks(path)
    await marks.load()
    marks.begin()
    marks.heard(later)
    marks.connected_through(first_start + 1)
    await marks.close()
    assert on_disk(path) == later  # caught up, and live until its newest event


def on_disk(path: Path) -> int:
    return int(json.loads(path.read_text())["connected_until"])


async def test_a_file_the_start_could_not_read_is_not_written_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unreadable at the start (EIO), the marks cost this start its catch-up; but the first new mark
    then replaced the file, and every later start lost the catch-up of the chats it tracked too."""
    path = tmp_path / "discord_seen.json"
    before = {"newest": {"123": str(5_000 << 22)}, "connected_until": str(6_000 << 22)}
    path.write_text(json.dumps(before) + "\n")
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:  # the disk cannot read it now (a bad sector)
        if self == path:
            raise OSError(errno.EIO, "Input/output error", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    marks = SeenMarks(path)
    await marks.load()
    monkeypatch.undo()
    assert marks.begin() == {}  # this start reads no chat's history
    marks.saw("456", 7_000 << 22, start=True)
    marks.connected_through(8_000 << 22)
    await marks.close()

    again = SeenMarks(path)  # a later start reads it
    await again.load()
    assert again.begin() == {"123": 5_000 << 22} and again.connected_until == 6_000 << 22
