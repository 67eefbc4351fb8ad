"""The write path's failures: a turn whose writes failed is made again, without undoing an operator's edit."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest

from bot.domain import Message, Role
from bot.memory import Exchange, Layer
from bot.memory.item_snapshot import SNAPSHOT
from bot.memory.item_store import ItemStore
from bot.memory.tool import MemoryTool
from bot.tools.base import ToolContext
from tests.bot.memory.conftest import Clock, make_memory
from tests.bot.memory.test_items import item


def exchange(clock: Clock, user: str, answer: str) -> Exchange:
    return Exchange(
        "cli:me",
        Message(Role.USER, user, timestamp=clock.now),
        Message(Role.ASSISTANT, answer, timestamp=clock.now),
    )


class FullDisk:
    """Writes to paths holding ``where`` fail with ENOSPC while ``full`` (at the system call: our code
    runs as it would); other files still fit."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
        self.full = False
        real = os.write

        def write(fd: int, data: Any) -> int:
            if self.full and where in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data)

        monkeypatch.setattr(os, "write", write)


async def test_a_note_line_the_operator_corrected_after_a_failed_write_is_not_written_again(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The items of a turn hit a full disk, its note line did not; the operator corrects that line
    before the next turn, which makes the turn's items again and must leave the note as corrected."""
    disk = FullDisk(monkeypatch, "/memory/items/")  # the note line, a few bytes, still fits
    memory = await make_memory(tmp_path, clock)
    disk.full = True
    with pytest.raises(OSError, match="No space"):
        await memory.record_exchanges(
            [exchange(clock, "My sister Hanna lives in Porto.", "Noted.")], sync=False
        )
    note = memory.notes.path_for(clock.now.date())
    written = note.read_text()
    assert "Hanna lives in Porto" in written
    note.write_text(written.replace("Porto", "Lisbon"))  # the operator's correction
    disk.full = False

    clock.advance(minutes=5)
    await memory.record_exchanges([exchange(clock, "What is the weather like?", "Sunny.")], sync=False)
    await memory.close()

    text = note.read_text()
    assert "Porto" not in text and text.count("Hanna lives in Lisbon") == 1
    assert "What is the weather like?" in text
    assert [i for i in memory.items.items(Layer.EPISODIC) if "Hanna lives in Porto" in i.content]


async def test_a_note_line_whose_append_failed_is_written_by_the_next_turn_once(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FullDisk(monkeypatch, "/memory/2024-05-20.md")
    memory = await make_memory(tmp_path, clock)
    disk.full = True
    with pytest.raises(OSError, match="No space"):
        await memory.record_exchanges(
            [exchange(clock, "My sister Hanna lives in Porto.", "Noted.")], sync=False
        )
    note = memory.notes.path_for(clock.now.date())
    assert note.read_text() == ""  # made, and the failed append cut back off
    stored = [i.id for i in memory.items.items(Layer.EPISODIC) if "Hanna" in i.content]
    disk.full = False

    clock.advance(minutes=5)
    await memory.record_exchanges([exchange(clock, "What is the weather like?", "Sunny.")], sync=False)
    await memory.close()

    text = note.read_text()
    assert text.count("Hanna lives in Porto") == 1 and text.count("What is the weather like?") == 1
    assert stored and [i.id for i in memory.items.items(Layer.EPISODIC) if "Hanna" in i.content] == stored


async def test_items_the_full_disk_refused_are_not_counted_as_lines_of_their_log(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store counted the lines of a failed append as in the log: until a restart, every snapshot was
    refused (its log held "other lines than the store counted") and the log was never compacted."""
    disk = FullDisk(monkeypatch, "/memory/items/")
    memory = await make_memory(tmp_path, clock)
    disk.full = True
    with pytest.raises(OSError, match="No space"):
        await memory.record_exchanges(
            [exchange(clock, "My sister Hanna lives in Porto.", "Noted.")], sync=False
        )
    disk.full = False  # space is back

    clock.advance(minutes=5)
    await memory.record_exchanges([exchange(clock, "What is the weather like?", "Sunny.")], sync=False)
    assert await memory.items.save_snapshot()
    await memory.close()
    assert (tmp_path / "memory" / "items" / "snapshot.bin").exists()
    again = await make_memory(tmp_path, clock)  # a restart, from the snapshot and the logs' tails
    contents = [i.content for i in again.items.items(Layer.EPISODIC)]
    assert any("Hanna lives in Porto" in c for c in contents) and any("weather" in c for c in contents)
    await again.close()


async def test_a_decay_the_full_disk_refused_is_written_once_space_is_back_and_the_snapshot_saved(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version a failed append left out was written only with the item's next version: one decay on a
    full disk (or a flush of touches, a promotion, an update) held every snapshot off until a restart."""
    disk = FullDisk(monkeypatch, "/items/")
    store = ItemStore(tmp_path / "items")
    await store.load()
    stored = await store.add(item(clock, "Hanna lives in Porto"))
    clock.advance(days=40)
    disk.full = True
    with pytest.raises(OSError, match="No space"):
        await store.decay(clock.now, 30)
    disk.full = False  # space is back
    assert await store.save_snapshot()
    (tmp_path / "items" / SNAPSHOT).unlink()  # a restart from the logs alone
    again = ItemStore(tmp_path / "items")
    await again.load()
    faded = again.get(stored.id)
    assert faded is not None and faded.salience == stored.salience / 2


async def test_a_failed_append_whose_caller_was_cancelled_is_counted_and_written_again(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller cancelled while its items were written (/stop, a timeout) took the store's account of
    the append with it: a failed one stayed counted as lines of its log (never compacted again, "changed
    elsewhere") and its items were taken for stored."""
    disk = FullDisk(monkeypatch, "/items/")
    store = ItemStore(tmp_path / "items")
    await store.load()
    first = await store.add(item(clock, "Hanna lives in Porto"))
    disk.full = True
    adding = asyncio.create_task(store.add_many([item(clock, "Ines lives in Braga")]))
    await asyncio.sleep(0)  # its lines are queued
    adding.cancel()
    with pytest.raises(asyncio.CancelledError):
        await adding
    await store.drain()  # the append failed all the same
    disk.full = False  # space is back
    for n in range(8):  # versions enough for the log to be compacted
        await store.put(first.with_changes(salience=0.5 + n / 100))
    assert await store.compact() == 1
    assert await store.save_snapshot()
    (tmp_path / "items" / SNAPSHOT).unlink()  # a restart from the logs alone
    again = ItemStore(tmp_path / "items")
    await again.load()
    assert sorted(i.content for i in again.items()) == ["Hanna lives in Porto", "Ines lives in Braga"]


async def test_an_item_forgotten_on_a_full_disk_stays_forgotten_after_a_restart(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store dropped the item before its tombstone was written: on a full disk the forget was in
    memory only, and the item came back at the next start."""
    disk = FullDisk(monkeypatch, "/memory/items/")
    memory = await make_memory(tmp_path, clock)
    tool, ctx = MemoryTool(memory), ToolContext("cli:me", "cli", "turn1")
    saved = await tool.run({"action": "add", "content": "User's cat is called Miso", "type": "fact"}, ctx)
    item_id = saved.split()[2]
    disk.full = True
    with pytest.raises(OSError, match="No space"):
        await tool.run({"action": "forget", "id": item_id}, ctx)
    assert memory.items.get(item_id) is None  # forgotten for the running bot all the same
    disk.full = False  # space is back
    await memory.close()
    again = await make_memory(tmp_path, clock)  # a restart
    assert again.items.get(item_id) is None
    assert await MemoryTool(again).run({"action": "search", "query": "cat"}, ctx) == "No matching memories."
    await again.close()
