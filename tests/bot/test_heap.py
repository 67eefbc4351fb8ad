"""The collector paused around bulk loads: nothing collected meanwhile, resumed after, errors included."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.heap import collector_paused
from bot.memory.item_store import ItemStore
from bot.memory.items import ItemType, Layer, MemoryItem, Reference


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of every cyclic collection that starts while the test runs."""
    seen: list[int] = []

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(count)
    try:
        yield seen
    finally:
        gc.callbacks.remove(count)


def test_what_a_large_load_built_is_frozen_and_a_small_one_is_not() -> None:
    before = gc.get_freeze_count()
    try:
        with collector_paused():
            kept = [[n] for n in range(1000)]
        assert gc.get_freeze_count() == before
        with collector_paused() as paused:
            kept += [[n] for n in range(1000)]
            paused.freeze = True
        assert gc.get_freeze_count() >= before + 1000
    finally:
        gc.unfreeze()


def test_paused_nested_and_after_an_error_it_resumes_once() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner one does not resume what the outer paused
        raise RuntimeError("a failed load")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # paused by someone else before: left so
    finally:
        gc.enable()


async def test_loading_the_items_runs_no_collection(tmp_path: Path, collections: list[int]) -> None:
    at = datetime(2024, 5, 20, tzinfo=UTC)
    store = ItemStore(tmp_path)
    await store.load()
    await store.add_many(
        [
            MemoryItem(
                layer=Layer.EPISODIC,
                type=ItemType.EPISODE,
                title=f"note {n}",
                content=f"note number {n} about the garden",
                created_at=at,
                updated_at=at,
                last_accessed_at=at,
                references=(Reference("cli:me", f"m{n}"),),
            )
            for n in range(3000)
        ]
    )
    fresh = ItemStore(tmp_path)
    gc.collect(0)  # a young collection due now would not be the load's
    collections.clear()
    await fresh.load()  # ~100,000 objects: over a hundred collections unpaused
    # At most the one the resumed collector starts at the next allocation, for what the load left young.
    assert len(collections) <= 1, collections
