"""The transcript archive: a damaged line costs only itself, for reading and for searching."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.domain import Message, Role
from bot.memory import archive as archive_module
from bot.memory.archive import ArchiveHit, TranscriptArchive, search_archive

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


@pytest.mark.parametrize(
    "before",
    [b"", b'{"archived_at": "2025-03-04"}\n'],
    ids=["the file holds only the cut record", "after a whole record"],
)
async def test_a_record_a_kill_cut_short_is_kept_aside_and_cut_before_the_next(
    tmp_path: Path, before: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Longer than the blocks the end is read back in: its start is still found."""
    monkeypatch.setattr(archive_module, "TAIL_BLOCK", 8)
    archive = TranscriptArchive(tmp_path)
    path = archive.path_for("cli:me")
    cut = b'{"archived_at": "2025-03-04", "message": {"role": "user", "content": "half a'
    await asyncio.to_thread(path.write_bytes, before + cut)
    await archive.append(
        "cli:me", [Message(Role.USER, "after the restart")], datetime(2025, 3, 5, tzinfo=UTC)
    )

    data = await asyncio.to_thread(path.read_bytes)
    assert data.startswith(before) and cut not in data and data.endswith(b"\n")
    assert [m.content for m in await archive.read("cli:me")] == ["after the restart"]
    kept = await asyncio.to_thread(lambda: [p.read_bytes() for p in tmp_path.glob("*.damaged-*")])
    assert kept == [cut + b"\n"]


async def test_messages_a_kill_kept_in_the_session_are_not_archived_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read back in blocks smaller than a record: the ids of the last records are still found."""
    monkeypatch.setattr(archive_module, "TAIL_BLOCK", 8)
    archive = TranscriptArchive(tmp_path)
    when = datetime(2025, 3, 4, tzinfo=UTC)
    kept = [Message(Role.USER, f"said {n}") for n in range(3)]
    assert await archive.append("cli:me", kept, when) == 3
    # The session file still holds them, without the mark the append set (its save never ran).
    reloaded = [Message.from_dict({**m.to_dict(), "meta": {}}) for m in kept]
    assert await archive.append("cli:me", [*reloaded, Message(Role.USER, "said later")], when) == 1
    assert [m.content for m in await archive.read("cli:me")] == ["said 0", "said 1", "said 2", "said later"]


def long_chat(archive: TranscriptArchive, when: datetime, size: int) -> list[Message]:
    """A chat's archive of about ``size`` bytes, written as the bot writes it; its messages."""
    said = [Message(Role.USER, f"{n} " + "x" * 2000, timestamp=when) for n in range(size // 2200)]
    path = archive.path_for("cli:me")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"".join(
            json.dumps(
                {"archived_at": when.isoformat(), "session_id": "cli:me", "message": m.to_dict()}
            ).encode()
            + b"\n"
            for m in said
        )
    )
    return said


def unmarked(messages: list[Message]) -> list[Message]:
    """As a session file holds them after a kill before its save: without the archived mark."""
    return [Message.from_dict({**m.to_dict(), "meta": {}}) for m in messages]


@pytest.mark.parametrize("where", ["last", "first", "none"])
async def test_a_resumed_retirement_looks_through_the_archive_in_bounded_memory(
    tmp_path: Path, where: str
) -> None:
    """A resume looks for its messages in the whole file (later retirements may follow theirs), a block
    at a time from the end: it holds one block, not a long-lived chat's archive, wherever they are."""
    archive = TranscriptArchive(tmp_path)
    when = datetime(2025, 3, 4, tzinfo=UTC)
    said = long_chat(archive, when, 4 * 2**20)
    retired = {"last": said[-3:], "first": said[:3], "none": [Message(Role.USER, "never archived")]}[where]

    tracemalloc.start()
    read_before = bytes_read()
    try:
        added = await archive.append("cli:me", unmarked(retired), when, look_in="file")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    read = bytes_read() - read_before
    assert added == (1 if where == "none" else 0)
    assert peak < 2**20, f"held {peak / 2**20:.1f} MiB looking through a 4 MiB archive"
    if where == "last":  # the common case (a kill during the consolidation): the end is enough
        assert read < 2**20, f"read {read / 2**20:.1f} MiB to find the last records"


def bytes_read() -> int:
    """What this process has read so far (Linux's count, which the read-back of the archive adds to)."""
    io = Path("/proc/self/io").read_text()
    return int(next(line for line in io.splitlines() if line.startswith("rchar:")).split()[1])


async def test_a_search_gives_the_newest_hits_first_and_the_first_found_of_equally_new(
    tmp_path: Path,
) -> None:
    archive = TranscriptArchive(tmp_path)
    day = [datetime(2025, 3, d, tzinfo=UTC) for d in range(1, 6)]
    said = {  # (content, day index); every chat's file is searched, in the order of their names
        "cli:a": [("needle a0", 2), ("needle a1", 4), ("hay a2", 4), ("NEEDLE a3", 0), ("needle a4", 2)],
        "cli:b": [("needle b0", 4), ("needle b1", 3), ("needle b2", 2)],
    }
    for chat, messages in said.items():
        await archive.append(chat, [Message(Role.USER, c, timestamp=day[d]) for c, d in messages], day[4])

    def found(limit: int, session_id: str | None = None) -> list[str]:
        hits = search_archive(tmp_path, ["Needle"], session_id=session_id, limit=limit)
        return [h.message.content for h in hits]

    everything = ["needle a1", "needle b0", "needle b1", "needle a0", "needle a4", "needle b2", "NEEDLE a3"]
    assert await asyncio.to_thread(found, 20) == everything
    assert await asyncio.to_thread(found, 4) == everything[:4]
    assert await asyncio.to_thread(found, 5) == everything[:5]
    assert await asyncio.to_thread(found, 2, "cli:b") == ["needle b0", "needle b1"]


async def test_a_common_word_over_a_long_archive_is_searched_in_bounded_memory(tmp_path: Path) -> None:
    """Every message of a 4 MiB archive holds the word: only the few asked for are kept, never the file."""
    archive = TranscriptArchive(tmp_path)
    said = long_chat(archive, datetime(2025, 3, 4, tzinfo=UTC), 4 * 2**20)

    def search() -> tuple[list[ArchiveHit], int]:
        tracemalloc.start()
        try:
            hits = search_archive(tmp_path, ["xxx"], session_id="cli:me", limit=5, context=10)
            return hits, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    hits, peak = await asyncio.to_thread(search)
    assert [h.message.id for h in hits] == [m.id for m in said[:5]]  # equally new: the first found
    assert peak < 2**20, f"held {peak / 2**20:.1f} MiB searching a 4 MiB archive"
