"""ItemIndex: filed change by change, it finds exactly what an index built from scratch finds.

A store re-files only what an item's new version changed (a repeat adds one reference of up to 24).
Random runs of the store's writes (add, merge, put, delete, touch, promote, decay, reload) check after
every step that each lookup over every key answers as an index rebuilt from the live items does, that
its tables are the same, and that every message of a changed item has a new stamp; at the end, the
same against a store loaded from disk. Seeded: a failure replays.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from bot.memory import items as items_module
from bot.memory.item_index import SUBJECT_TAG, ItemIndex
from bot.memory.item_store import ItemStore
from bot.memory.items import SENTENCE_TAG, ItemType, Layer, MemoryItem, Reference

START = datetime(2024, 5, 20, 9, 0, tzinfo=UTC)
SESSIONS = ("tg:1", "tg:2", "dc:3")
CONVERSATIONS = ("", "c1", "c2")
MESSAGES = tuple(f"m{n}" for n in range(5))
WORDS = ("tea", "bike", "paris", "berlin", "ok thanks", "saddle")
SUBJECTS = ("home", "job", "bike")
TYPES = (ItemType.EPISODE, ItemType.EPISODE, ItemType.FACT, ItemType.PREFERENCE)
DAYS = 4


def a_reference(rng: random.Random) -> Reference:
    session = rng.choice(SESSIONS)
    if rng.random() < 0.1:
        return Reference(session)  # a fact with no message (the memory tool's)
    part = rng.choice((None, None, 0, 1, 2))
    # A message is said in one conversation: the same message id always names the same one.
    conversation = CONVERSATIONS[(SESSIONS.index(session) + MESSAGES.index(m := rng.choice(MESSAGES))) % 3]
    return Reference(session, m, part=part, conversation=conversation)


def a_time(rng: random.Random) -> datetime:
    # Half hours over a few days, so that some items share a moment (ties are broken by id).
    return START + timedelta(minutes=rng.randrange(DAYS * 24 * 60 // 30) * 30)


def some_tags(rng: random.Random) -> tuple[str, ...]:
    tags = [rng.choice(("user", "assistant"))]
    tags += [SUBJECT_TAG + s for s in SUBJECTS if rng.random() < 0.25]
    if rng.random() < 0.2:
        tags.append(SENTENCE_TAG)
    return tuple(tags)


def new_item(rng: random.Random) -> MemoryItem:
    at = a_time(rng)
    content = " ".join(rng.sample(WORDS, rng.randint(1, 2)))  # few contents: repeats merge often
    return MemoryItem(
        layer=rng.choice((Layer.EPISODIC, Layer.EPISODIC, Layer.SEMANTIC)),
        type=rng.choice(TYPES),
        title=content,
        content=content,
        created_at=at,
        updated_at=at,
        last_accessed_at=at,
        tags=some_tags(rng),
        confidence=rng.choice((0.5, 0.8)),
        references=tuple(a_reference(rng) for _ in range(rng.choice((1, 1, 2)))),
    )


def changed(rng: random.Random, item: MemoryItem) -> MemoryItem:
    """A new version of ``item``: what a put may change, one thing or several."""
    changes: dict[str, Any] = {"updated_at": item.updated_at + timedelta(minutes=1)}
    for _ in range(rng.randint(1, 2)):
        what = rng.randrange(9)
        if what == 0:
            changes["salience"] = rng.random()
        elif what == 1:
            changes["content"] = rng.choice(WORDS)
        elif what == 2:
            changes["tags"] = some_tags(rng)
        elif what == 3 and item.references:  # one dropped
            refs = list(item.references)
            del refs[rng.randrange(len(refs))]
            changes["references"] = tuple(refs)
        elif what == 4:  # one more, last or first
            more = a_reference(rng)
            changes["references"] = (
                (*item.references, more) if rng.random() < 0.5 else (more, *item.references)
            )
        elif what == 5:  # the same ones, as new objects (equal, not identical)
            changes["references"] = tuple(Reference(**r.to_dict()) for r in item.references)
        elif what == 6:  # in another order: another part may come first for a message
            changes["references"] = tuple(rng.sample(item.references, len(item.references)))
        elif what == 7:
            changes["type"] = rng.choice(TYPES)
        else:  # within its day: a version in another day's log would not replace this one at a load
            changes["created_at"] = item.created_at.replace(hour=rng.randrange(24))
    return item.with_changes(**changes)


async def a_step(rng: random.Random, store: ItemStore, now: datetime) -> None:
    live = store.items()
    what = rng.randrange(10)
    if what <= 3 or not live:  # new items, and repeats of live ones (a merge)
        batch = [new_item(rng) for _ in range(rng.randint(1, 3))]
        if live and rng.random() < 0.5:
            said_again = rng.choice(live)
            batch.append(said_again.with_changes(id=new_item(rng).id, references=(a_reference(rng),)))
        await store.add_many(batch)
    elif what <= 5:
        await store.put_many(changed(rng, rng.choice(live)) for _ in range(rng.randint(1, 2)))
    elif what == 6:
        await store.delete(rng.choice(live).id, now)
    elif what == 7:
        store.touch_many((rng.choice(live).id for _ in range(3)), now)
        if rng.random() < 0.5:
            await store.flush_touches()
    elif what == 8:
        await store.promote(now, 0.75)
    else:
        await (store.decay(now, 1) if rng.random() < 0.5 else store.load())


def found(index: ItemIndex, fingerprints: set[str]) -> dict[str, Any]:
    """Every lookup over every key the runs can make, as ids (sets where the order is not promised)."""
    keys = [(s, m) for s in SESSIONS for m in MESSAGES]
    ends = [START + timedelta(hours=h) for h in range(0, DAYS * 24 + 1, 13)]
    spans = [*pairwise(ends), (ends[0], ends[-1])]  # each half day, and all of them
    return {
        "of_message": {k: sorted(i.id for i in index.of_message(k)) for k in keys},
        "passages": {k: [i.id for i in index.passages(k)] for k in keys},
        "neighbours": {k: index.neighbours(k, within=timedelta(hours=w)) for k in keys for w in (1, 6, 48)},
        "stamped": {k for k in keys if index.stamp_of(k)} >= {k for k in keys if index.of_message(k)},
        "with_subject": {s: sorted(i.id for i in index.with_subject(s)) for s in SUBJECTS},
        "with_fingerprint": {f: sorted(i.id for i in index.with_fingerprint(f)) for f in fingerprints},
        "of_session": {s: set(index.of_session(s)) for s in SESSIONS},
        "created_between": {span: [i.id for i in index.created_between(*span)] for span in spans},
        "newest_between": {
            (span, s): [i.id for i in index.newest_between(*span, session_id=s)]
            for span in spans
            for s in SESSIONS
        },
    }


def filed(index: ItemIndex) -> dict[str, Any]:
    """The index's own tables: the same state, not only the same answers (a message's place among
    several offers shows in its neighbours only now and then). Stamps aside: they count changes."""
    skip = ("_items", "_message_stamps", "_stamp")
    return {name: table for name, table in vars(index).items() if name not in skip}


def rebuilt(store: ItemStore) -> ItemIndex:
    live = {i.id: i for i in store.items()}
    index = ItemIndex(live)
    index.rebuild(live)
    return index


def message_keys(item: MemoryItem) -> set[tuple[str, str]]:
    return {k for r in item.references if (k := r.message_key) is not None}


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("per_chat", [False, True], ids=["workspace", "chat"])
async def test_an_index_filed_change_by_change_finds_what_one_built_from_scratch_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, per_chat: bool
) -> None:
    # References are bounded at 6 here (24 in use), so that repeats drop old ones often.
    monkeypatch.setattr(items_module, "REFERENCES_KEPT", 6)
    monkeypatch.setattr(items_module, "FIRST_REFERENCES_KEPT", 2)
    rng = random.Random(seed)
    store = ItemStore(tmp_path, per_chat=per_chat)
    await store.load()
    now = START
    for step in range(120):
        failure = f"seed {seed}, step {step}"
        before = {i.id: i for i in store.items()}
        stamps = {k: store.index.stamp_of(k) for i in before.values() for k in message_keys(i)}
        now += timedelta(hours=rng.choice((0, 1, 12)))
        await a_step(rng, store, now)
        fingerprints = {i.fingerprint for i in [*before.values(), *store.items()]}
        from_scratch = rebuilt(store)
        assert found(store.index, fingerprints) == found(from_scratch, fingerprints), failure
        assert filed(store.index) == filed(from_scratch), failure
        after = {i.id: i for i in store.items()}
        for item_id in before.keys() | after.keys():
            old, new = before.get(item_id), after.get(item_id)
            if old and new and new == old.with_changes(last_accessed_at=new.last_accessed_at):
                continue  # the same but for its last use: a touch
            # Changed: what recall built from its messages is stale.
            for key in set().union(*(message_keys(v) for v in (old, new) if v is not None)):
                assert store.index.stamp_of(key) > stamps.get(key, 0), failure
    await store.flush_touches()
    await store.drain()
    from_disk = ItemStore(tmp_path, per_chat=per_chat)
    await from_disk.load()
    assert {i.id for i in from_disk.items()} == {i.id for i in store.items()}
    fingerprints = {i.fingerprint for i in store.items()}
    assert found(from_disk.index, fingerprints) == found(store.index, fingerprints)
    assert filed(from_disk.index) == filed(store.index)
