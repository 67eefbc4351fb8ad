"""Items: fingerprint dedup, persistence as JSON lines, promotion, decay, forgetting, log compaction."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path

import pytest

from bot.memory import item_store
from bot.memory.item_index import NEWEST_CHUNK
from bot.memory.item_store import ItemStore
from bot.memory.items import ItemType, Layer, MemoryItem, Reference
from tests.bot.memory.conftest import Clock


def item(
    clock: Clock, content: str, *, type: ItemType = ItemType.FACT, layer: Layer = Layer.EPISODIC, **kw: object
) -> MemoryItem:
    return MemoryItem(
        layer=layer,
        type=type,
        title=content[:20],
        content=content,
        created_at=clock.now,
        updated_at=clock.now,
        last_accessed_at=clock.now,
        references=(Reference("cli:me", f"m-{content[:5]}"),),
        **kw,  # type: ignore[arg-type]
    )


async def test_duplicates_merge_by_fingerprint(tmp_path: Path, clock: Clock) -> None:
    store = ItemStore(tmp_path)
    await store.load()
    first = await store.add(item(clock, "User likes  Green tea", confidence=0.5))
    second = MemoryItem(
        **{
            **_fields(item(clock, "user likes green tea", confidence=0.8)),
            "references": (Reference("tg:1", "m9"),),
        }
    )
    merged = await store.add(second)
    assert merged.id == first.id
    assert merged.confidence == 0.9  # the stronger signal kept, and said again in another message: surer
    assert merged.references == (Reference("cli:me", "m-User "), Reference("tg:1", "m9"))
    assert len(store.items()) == 1
    other_type = await store.add(item(clock, "User likes green tea", type=ItemType.PREFERENCE))
    assert other_type.id != first.id


def _fields(i: MemoryItem) -> dict[str, object]:
    return {f: getattr(i, f) for f in MemoryItem.__dataclass_fields__ if f not in ("id", "fingerprint")}


async def test_a_message_said_again_and_again_keeps_a_bounded_list_of_where_it_was_said(
    tmp_path: Path, clock: Clock
) -> None:
    store = ItemStore(tmp_path)
    await store.load()
    for n in range(200):  # "ok, thanks!" in 200 chats: each repeat rewrites the item
        said = item(clock, "ok thanks a lot")
        await store.add(MemoryItem(**{**_fields(said), "references": (Reference(f"tg:{n}", "m"),)}))
    await store.load()  # what is on disk agrees
    (only,) = [
        i for i in store.index.created_between(clock.now - timedelta(days=1), clock.now + timedelta(days=1))
    ]
    chats = [r.session_id for r in only.references]
    assert len(chats) == 24 and chats[0] == "tg:0" and chats[-1] == "tg:199"
    line = max((tmp_path / "episodic").glob("*.jsonl")).read_text().splitlines()[-1]
    assert len(line) < 4000  # the 200th write is as small as the 24th


async def test_items_survive_reload_with_last_version_winning(tmp_path: Path, clock: Clock) -> None:
    store = ItemStore(tmp_path)
    await store.load()
    a = await store.add(item(clock, "alpha fact"))
    b = await store.add(item(clock, "beta fact", layer=Layer.SEMANTIC))
    await store.put(a.with_changes(content="alpha fact, corrected"))
    await store.delete(b.id, clock.now)
    day_file = tmp_path / "episodic" / "2024-05-20.jsonl"
    assert day_file.exists() and (tmp_path / "semantic.jsonl").exists()

    reloaded = ItemStore(tmp_path)
    await reloaded.load()
    assert [i.content for i in reloaded.items()] == ["alpha fact, corrected"]
    assert reloaded.items()[0].references == a.references


async def test_a_folder_where_a_log_belongs_is_set_aside_and_the_other_logs_load(
    tmp_path: Path, clock: Clock
) -> None:
    """A folder in a day's log's place stopped the start ("Is a directory"): it holds no items and never
    becomes readable by itself. It is kept aside, the other logs load, and new items are written as before."""
    store = ItemStore(tmp_path)
    await store.load()
    await store.add(item(clock, "semantic fact", layer=Layer.SEMANTIC))
    assert await store.save_snapshot()  # (the start reads the snapshot, then the logs)
    day_file = tmp_path / "episodic" / "2024-05-19.jsonl"
    (day_file / "inside").mkdir(parents=True)

    reloaded = ItemStore(tmp_path)
    await reloaded.load()
    assert [i.content for i in reloaded.items()] == ["semantic fact"]
    [aside] = (tmp_path / "episodic").glob("2024-05-19.jsonl.folder-*")
    assert (aside / "inside").is_dir()  # kept, not deleted
    await reloaded.add(item(clock, "a new episode"))
    assert {i.content for i in reloaded.items()} == {"semantic fact", "a new episode"}


async def test_promotion_copies_confident_items_and_keeps_references(tmp_path: Path, clock: Clock) -> None:
    store = ItemStore(tmp_path)
    await store.load()
    pref = await store.add(item(clock, "prefers dark mode", type=ItemType.PREFERENCE, confidence=0.8))
    fix = await store.add(item(clock, "fixed it by clearing the cache", type=ItemType.FIX, confidence=0.9))
    await store.add(item(clock, "maybe likes jazz", type=ItemType.PREFERENCE, confidence=0.5))
    await store.add(item(clock, "said hello", type=ItemType.EPISODE, confidence=0.9))

    promoted = await store.promote(clock.now, 0.75)

    assert {(p.layer, p.content) for p in promoted} == {
        (Layer.SEMANTIC, "prefers dark mode"),
        (Layer.PROCEDURAL, "fixed it by clearing the cache"),
    }
    assert all(p.references for p in promoted)
    assert store.get(pref.id).promoted_to is not None  # type: ignore[union-attr]
    assert store.get(fix.id).promoted_to is not None  # type: ignore[union-attr]
    assert await store.promote(clock.now, 0.75) == []  # promotion happens once


async def test_decay_fades_stale_items_but_never_promoted_ones(tmp_path: Path, clock: Clock) -> None:
    store = ItemStore(tmp_path)
    await store.load()
    stale = await store.add(item(clock, "old chatter", type=ItemType.EPISODE, salience=0.6))
    kept = await store.add(
        item(clock, "prefers tabs", type=ItemType.PREFERENCE, confidence=0.9, salience=0.6)
    )
    await store.promote(clock.now, 0.75)
    clock.advance(days=10)
    fresh = await store.add(item(clock, "new chatter", type=ItemType.EPISODE, salience=0.6))

    clock.advance(days=25)
    assert await store.decay(clock.now, 30) == 1

    assert store.get(stale.id).salience == 0.3  # type: ignore[union-attr]
    assert store.get(kept.id).salience == 0.6  # type: ignore[union-attr]
    assert store.get(fresh.id).salience == 0.6  # type: ignore[union-attr]
    assert len(store.items()) == 4  # decay never deletes
    clock.advance(days=1)
    assert await store.decay(clock.now, 30) == 0  # decayed items wait another period


async def test_decay_lets_turns_run_between_its_steps_and_follows_what_they_changed(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A month away, every item decays at the next maintenance: 100,000 of them held every chat's turns
    for ~5 s in one go. Now it goes in steps, and a step decides from the items as they are by then."""
    monkeypatch.setattr(item_store, "MAINTENANCE_STEP", 2)
    store = ItemStore(tmp_path)
    await store.load()
    chatter = [
        await store.add(item(clock, f"chatter {n}", type=ItemType.EPISODE, salience=0.6)) for n in range(6)
    ]
    clock.advance(days=40)
    recalled_during: list[bool] = []

    async def a_turn_recalls_the_last_one() -> None:
        last = store.get(chatter[-1].id)
        assert last is not None
        await store.put(last.with_changes(last_accessed_at=clock.now))
        recalled_during.append(not decaying.done())

    decaying = asyncio.create_task(store.decay(clock.now, 30))  # starts first: the last one is due
    turn = asyncio.create_task(a_turn_recalls_the_last_one())
    assert await decaying == 5
    await turn
    assert recalled_during == [True]
    assert [store.get(c.id).salience for c in chatter] == [0.3] * 5 + [0.6]  # type: ignore[union-attr]


async def store_with_ten_versions(root: Path, clock: Clock) -> tuple[ItemStore, MemoryItem]:
    """A store whose semantic log holds one item written eleven times: ripe for compaction."""
    store = ItemStore(root)
    await store.load()
    x = await store.add(item(clock, "counter", layer=Layer.SEMANTIC))
    for n in range(10):
        x = await store.put(x.with_changes(salience=n / 10, updated_at=clock.now + timedelta(seconds=n)))
    return store, x


async def test_compaction_rewrites_logs_full_of_old_versions(tmp_path: Path, clock: Clock) -> None:
    store, x = await store_with_ten_versions(tmp_path, clock)
    assert await store.compact() == 1
    assert len((tmp_path / "semantic.jsonl").read_text().splitlines()) == 1
    reloaded = ItemStore(tmp_path)
    await reloaded.load()
    assert reloaded.get(x.id) == x


async def test_compaction_keeps_a_version_written_while_it_runs(tmp_path: Path, clock: Clock) -> None:
    """Two logs to rewrite, and a turn writes to the second while the first is rewritten: both are
    rewritten as they were when compaction looked (all rewrites are queued at once) and the turn's line
    lands after. (Before, the second was left for another day, logged as changed by another process.)"""
    store, semantic = await store_with_ten_versions(tmp_path, clock)
    procedural = await store.add(item(clock, "run the tests first", layer=Layer.PROCEDURAL))
    for n in range(10):
        procedural = await store.put(procedural.with_changes(salience=n / 10))

    async def a_turn_writes_meanwhile() -> None:
        await store.put(procedural.with_changes(content="run the tests first, always"))

    compacting = asyncio.create_task(store.compact())
    await asyncio.sleep(0)  # compaction has started: its first rewrite is under way
    await a_turn_writes_meanwhile()
    assert await compacting == 2
    reloaded = ItemStore(tmp_path)
    await reloaded.load()
    assert reloaded.get(procedural.id).content == "run the tests first, always"  # type: ignore[union-attr]
    assert reloaded.get(semantic.id) == semantic


async def test_compaction_never_drops_what_another_process_appended(tmp_path: Path, clock: Clock) -> None:
    bot, _ = await store_with_ten_versions(tmp_path, clock)
    importer = ItemStore(tmp_path)  # `membot memory import` while the bot runs
    await importer.load()
    await importer.add(item(clock, "imported fact", layer=Layer.SEMANTIC))

    assert await bot.compact() == 0
    reloaded = ItemStore(tmp_path)
    await reloaded.load()
    assert sorted(i.content for i in reloaded.items()) == ["counter", "imported fact"]


async def test_torn_last_line_is_ignored(tmp_path: Path, clock: Clock) -> None:
    store = ItemStore(tmp_path)
    await store.load()
    await store.add(item(clock, "kept", layer=Layer.SEMANTIC))
    with (tmp_path / "semantic.jsonl").open("ab") as f:
        f.write(b'{"id": "damaged \xff\xfe"}\n')  # a line that is not even UTF-8
        f.write(b'{"id": "torn", "layer": "sem')
    reloaded = ItemStore(tmp_path)
    await reloaded.load()
    assert [i.content for i in reloaded.items()] == ["kept"]

    # The torn line must not swallow the next item written after it.
    await reloaded.add(item(clock, "written after the crash", layer=Layer.SEMANTIC))
    again = ItemStore(tmp_path)
    await again.load()
    assert sorted(i.content for i in again.items()) == ["kept", "written after the crash"]


async def test_a_log_with_damaged_lines_is_rewritten_without_them_once_they_are_kept_aside(
    tmp_path: Path, clock: Clock
) -> None:
    """A kill can cut an append short where it crosses a page (seen in the soak test: a record cut at
    128 KiB). The next start keeps the fragment aside and records its message again; the first
    compaction then rewrites the log, so the fragment does not stay in the middle of it for good."""
    store = ItemStore(tmp_path)
    await store.load()
    await store.add(item(clock, "kept", layer=Layer.SEMANTIC))
    log = tmp_path / "semantic.jsonl"
    with log.open("ab") as f:
        f.write(b'{"id": "torn", "layer": "sem')
    reloaded = ItemStore(tmp_path)
    await reloaded.load()
    await reloaded.add(item(clock, "written after the crash", layer=Layer.SEMANTIC))
    assert await reloaded.compact() == 1  # two live items in three lines: only the damage is due
    assert [json.loads(line)["content"] for line in log.read_text().splitlines()] == [
        "kept",
        "written after the crash",
    ]
    [kept] = set_aside(tmp_path)
    assert kept.read_bytes() == b'{"id": "torn", "layer": "sem\n'
    assert await reloaded.compact() == 0  # done once


async def test_neighbours_are_the_turns_around_a_message_in_its_own_conversation(
    tmp_path: Path, clock: Clock
) -> None:
    store = ItemStore(tmp_path)
    await store.load()

    def said(text: str, message: str, conversation: str = "c1") -> MemoryItem:
        clock.advance(minutes=1)
        return MemoryItem(
            **{
                **_fields(item(clock, text, type=ItemType.EPISODE)),
                "references": (Reference("tg:1", message, conversation=conversation),),
            }
        )

    first, elsewhere, middle, last = (
        said("I bought a road bike", "m1"),
        said("unrelated talk in another conversation", "x1", conversation="c2"),
        said("which saddle fits it?", "m2"),
        said("a Brooks saddle", "m3"),
    )
    await store.add_many([first, elsewhere, middle, last])
    assert store.index.neighbours(("tg:1", "m2")) == [("tg:1", "m1"), ("tg:1", "m3")]
    assert store.index.neighbours(("tg:1", "x1")) == []  # alone in its conversation
    await store.delete(last.id, clock.now)
    assert store.index.neighbours(("tg:1", "m2")) == [("tg:1", "m1")]
    await store.load()  # the same after a restart
    assert store.index.neighbours(("tg:1", "m2")) == [("tg:1", "m1")]


def set_aside(folder: Path) -> list[Path]:
    return sorted(folder.glob("semantic.jsonl.damaged-*"))


DAMAGE = {
    "not utf-8": b'{"id": "damaged \xff\xfe"}',
    "reference not an object": b'{"id": "x", "layer": "semantic", "type": "fact", "created_at": "2025-01-01",'
    b' "updated_at": "2025-01-01", "references": [5]}',
    "number out of range": b'{"id": "x", "layer": "semantic", "type": "fact", "created_at": "2025-01-01",'
    b' "updated_at": "2025-01-01", "references": [{"session_id": "s", "turn": Infinity}]}',
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
async def test_a_damaged_line_costs_only_itself_and_is_kept_aside_before_compaction(
    tmp_path: Path, clock: Clock, damage: bytes
) -> None:
    store = ItemStore(tmp_path)
    await store.load()
    await store.add(item(clock, "before", layer=Layer.SEMANTIC))
    with (tmp_path / "semantic.jsonl").open("ab") as f:
        f.write(damage + b"\n")
    for _ in range(8):  # versions of one item after the damage: compaction will rewrite the log
        clock.advance(minutes=1)
        await store.add(item(clock, "after", layer=Layer.SEMANTIC))

    reloaded = ItemStore(tmp_path)
    await reloaded.load()
    assert sorted(i.content for i in reloaded.items()) == ["after", "before"]
    assert await reloaded.compact() == 1
    assert damage not in (tmp_path / "semantic.jsonl").read_bytes()
    [kept] = set_aside(tmp_path)
    assert kept.read_bytes() == damage + b"\n"


async def test_newest_between_reads_a_busy_day_newest_first_while_items_are_written(
    tmp_path: Path, clock: Clock
) -> None:
    """Today's notes read the newest few of a busy day a few entries at a time: items written or
    forgotten meanwhile neither repeat one nor skip another."""
    store = ItemStore(tmp_path)
    await store.load()
    start = clock.now
    written = []
    for n in range(3 * NEWEST_CHUNK + 5):
        written.append(await store.add(item(clock, f"note number {n} of the day")))
        clock.advance(seconds=1)
    end = clock.now
    forgotten = {written[10].id, written[NEWEST_CHUNK + 3].id}
    seen = []
    for found in store.index.newest_between(start, end):
        seen.append(found.id)
        if len(seen) == 50:  # a new item, a repeat merged into one not read yet, two older ones forgotten
            await store.add(item(clock, "said later"))
            await store.add(item(clock, "note number 3 of the day", confidence=0.9))
            for item_id in forgotten:
                await store.delete(item_id, clock.now)
    assert seen == [i.id for i in reversed(written) if i.id not in forgotten]
