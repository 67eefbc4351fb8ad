"""The Discord seen marks: a damaged file costs only the catch-up, never the start."""

from __future__ import annotations

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
