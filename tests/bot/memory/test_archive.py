"""The transcript archive: a damaged line costs only itself, for reading and for searching."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.domain import Message, Role
from bot.memory.archive import TranscriptArchive, search_archive

DAMAGE = {
    "torn json": b'{"message": {"role": "us',
    "message not an object": b'{"message": [1]}',
    "number out of range": b'{"message": {"role": "user", "content": "needle gone", "tokens": Infinity}}',
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
async def test_a_damaged_line_costs_only_itself(tmp_path: Path, damage: bytes) -> None:
    archive = TranscriptArchive(tmp_path)
    when = datetime(2025, 3, 4, tzinfo=UTC)
    await archive.append("cli:me", [Message(Role.USER, "needle one"), Message(Role.USER, "needle two")], when)
    path = archive.path_for("cli:me")
    first, second = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(first + damage + b"\n" + second)

    assert [m.content for m in await archive.read("cli:me")] == ["needle one", "needle two"]
    hits = await asyncio.to_thread(search_archive, tmp_path, ["needle"], session_id="cli:me")
    assert sorted(h.message.content for h in hits) == ["needle one", "needle two"]
