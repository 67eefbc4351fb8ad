"""Start-up from saved state: the items' snapshot and the lexical index on disk, and when they are void."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import pickle
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from bot.memory import item_snapshot
from bot.memory.item_snapshot import MAGIC, SNAPSHOT
from bot.memory.item_store import ItemStore
from bot.memory.items import Layer, MemoryItem
from bot.memory.lexical_file import FORMAT
from bot.memory.retrieval import Retriever
from bot.memory.word_index import INDEX_FILE
from tests.bot.memory.conftest import Clock
from tests.bot.memory.test_items import item


async def stored(root: Path, clock: Clock, *contents: str) -> ItemStore:
    store = ItemStore(root)
    await store.load()
    await store.add_many(item(clock, c) for c in contents)
    return store


async def reloaded(root: Path) -> ItemStore:
    store = ItemStore(root)
    await store.load()
    return store


async def test_a_start_reads_the_snapshot_and_only_what_was_appended_since(
    tmp_path: Path, clock: Clock
) -> None:
    store = await stored(tmp_path, clock, "alpha fact", "beta fact")
    assert await store.save_snapshot()
    gone = next(i for i in store.items() if i.content == "beta fact")
    await store.add(item(clock, "gamma fact"))  # after the snapshot: only in the log's tail
    await store.delete(gone.id, clock.now)
    clock.advance(days=1)
    await store.add(item(clock, "delta fact"))  # a log the snapshot never saw
    snap_before = (tmp_path / SNAPSHOT).read_bytes()
    assert {i.content for i in (await reloaded(tmp_path)).items()} == {
        "alpha fact",
        "gamma fact",
        "delta fact",
    }
    assert (tmp_path / SNAPSHOT).read_bytes() == snap_before  # loading never writes


async def test_the_snapshot_is_void_once_a_log_is_rewritten(tmp_path: Path, clock: Clock) -> None:
    store = await stored(tmp_path, clock, *(f"fact {i}" for i in range(10)))
    assert await store.save_snapshot()
    for round_ in (1, 2):  # a log of mostly old versions: compaction rewrites it
        for old in store.items():
            await store.put(
                old.with_changes(salience=0.5 + round_ / 10, updated_at=clock.now + timedelta(seconds=round_))
            )
    assert await store.compact() == 1
    assert not (tmp_path / SNAPSHOT).exists()
    assert len((await reloaded(tmp_path)).items()) == 10


async def test_lines_another_process_appended_are_never_hidden_behind_a_snapshot(
    tmp_path: Path, clock: Clock
) -> None:
    store = await stored(tmp_path, clock, "mine")
    other = await reloaded(tmp_path)  # membot memory import beside the bot
    await other.add(item(clock, "imported"))
    assert not await store.save_snapshot()  # the log holds a line this store does not know
    assert {i.content for i in (await reloaded(tmp_path)).items()} == {"mine", "imported"}


async def test_a_damaged_snapshot_costs_only_speed(tmp_path: Path, clock: Clock) -> None:
    store = await stored(tmp_path, clock, "alpha fact")
    assert await store.save_snapshot()
    (tmp_path / SNAPSHOT).write_bytes(MAGIC + b"\x80garbage")
    assert [i.content for i in (await reloaded(tmp_path)).items()] == ["alpha fact"]


async def test_a_snapshot_whose_items_do_not_add_up_is_not_used(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items are saved in chunks (one memo each); a file that ends after a whole chunk is still a valid
    stream of pickles, so the header's count is what tells it is short."""
    monkeypatch.setattr(item_snapshot, "CHUNK", 2)
    store = await stored(tmp_path, clock, *(f"fact {i}" for i in range(5)))
    assert await store.save_snapshot()
    whole = (tmp_path / SNAPSHOT).read_bytes()
    stream = io.BytesIO(whole)
    stream.seek(len(MAGIC))
    assert pickle.load(stream)["items"] == 5 and len(pickle.load(stream)) == 2  # header, first chunk
    (tmp_path / SNAPSHOT).write_bytes(whole[: stream.tell()])  # the rest is lost
    assert await asyncio.to_thread(item_snapshot.read, tmp_path) is None
    assert len((await reloaded(tmp_path)).items()) == 5  # from the logs (with it, 3 would be missing)
    (tmp_path / SNAPSHOT).write_bytes(whole)
    again = await asyncio.to_thread(item_snapshot.read, tmp_path)
    assert again is not None and len(again.items) == 5


def test_an_item_pickles_as_the_tuple_of_its_fields_and_loads_the_list_a_snapshot_1_held(
    clock: Clock,
) -> None:
    one = item(clock, "my bike is a red Gazelle", tags=("subject:bike",))
    assert pickle.loads(pickle.dumps(one)) == one
    assert one.__getstate__() == tuple(getattr(one, f.name) for f in dataclasses.fields(one))
    before = object.__new__(MemoryItem)  # as pickle makes it, then hands it the state
    before.__setstate__([getattr(one, f.name) for f in dataclasses.fields(one)])  # dataclasses' own form
    assert before == one and before.references == one.references


async def test_the_saved_index_is_checked_against_the_items_at_start(tmp_path: Path, clock: Clock) -> None:
    store = await stored(tmp_path, clock, "green tea in the morning", "black coffee at noon")
    retriever = Retriever(store)
    await retriever.ready()
    await retriever.save()
    assert (tmp_path / INDEX_FILE).exists()
    tea = next(i for i in store.items() if "tea" in i.content)
    await store.put(tea.with_changes(content="herbal infusion in the morning", title="herbal infusion"))
    await store.add(item(clock, "jasmine tea after dinner"))  # written after the index was saved

    again = await reloaded(tmp_path)
    fresh = Retriever(again)
    await fresh.ready()
    now = clock.now
    assert [s.item.content for s in fresh.rank("tea", now)] == ["jasmine tea after dinner"]
    assert [s.item.content for s in fresh.rank("herbal infusion", now)] == ["herbal infusion in the morning"]
    assert [s.item.layer for s in fresh.rank("coffee", now)] == [Layer.EPISODIC]


@pytest.mark.parametrize("damage", ["not an index", "cut in half", "empty", "header without keys"])
async def test_an_unreadable_index_file_is_built_again(tmp_path: Path, clock: Clock, damage: str) -> None:
    store = await stored(tmp_path, clock, "green tea")
    first = Retriever(store)
    await first.ready()
    await first.save()
    path = tmp_path / INDEX_FILE
    saved = path.read_bytes()
    if damage == "not an index":
        path.write_bytes(json.dumps({"not": "an index"}).encode())
    elif damage == "cut in half":  # a torn zip: zipfile's own error, not an OSError
        path.write_bytes(saved[: len(saved) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        header = json.dumps({"format": FORMAT}).encode()
        np.savez(path.with_suffix(""), header=np.frombuffer(header, dtype=np.uint8))
    retriever = Retriever(store)
    await retriever.ready()
    assert [s.item.content for s in retriever.rank("tea", clock.now)] == ["green tea"]
