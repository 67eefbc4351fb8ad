"""VectorStore: vectors embedded once in the background, persisted, reloaded without recomputation."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from bot.allocator import release_free_memory
from bot.errors import LLMUnavailable
from bot.memory import vector_file, vector_search, vectors
from bot.memory.items import ItemType, Layer, MemoryItem
from bot.memory.vector_search import Feedback
from bot.memory.vectors import VectorStore

NOW = datetime(2024, 5, 20, 9, 30, tzinfo=UTC)
SYNONYMS = {"automobile": "car", "vehicle": "car", "puppy": "dog"}


class WordsEmbedder:
    """An honest Embedder: bag of words hashed into ``dim`` dimensions, with a few synonyms folded.

    It records every call, can fail the next ``fail`` calls like an endpoint that is down, and holds
    any call that contains a text in ``slow`` until ``release`` is set (a model busy with a big batch).
    """

    def __init__(self, model_id: str = "words-v1", dim: int = 32) -> None:
        self.model_id = model_id
        self.dim = dim
        self.calls: list[list[str]] = []
        self.fail = 0
        self.slow: set[str] = set()
        self.release = asyncio.Event()
        self.entered_slow = asyncio.Event()
        self.succeeded = asyncio.Event()

    def vector(self, text: str) -> list[float]:
        out = [0.0] * self.dim
        for raw in text.lower().split():
            word = SYNONYMS.get(raw.strip(".,?!"), raw.strip(".,?!"))
            out[int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        return out

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        if self.fail:
            self.fail -= 1
            raise LLMUnavailable("embeddings endpoint unreachable: ConnectError")
        if self.slow & set(texts):
            self.entered_slow.set()
            await self.release.wait()
        self.succeeded.set()
        return np.array([self.vector(t) for t in texts], dtype=np.float32)

    @property
    def texts_embedded(self) -> int:
        return sum(len(c) for c in self.calls)


def item(content: str, **changes: object) -> MemoryItem:
    fields: dict[str, object] = {
        "layer": Layer.EPISODIC,
        "type": ItemType.EPISODE,
        "title": content[:20],
        "content": content,
        "created_at": NOW,
        "updated_at": NOW,
        "last_accessed_at": NOW,
    }
    fields.update(changes)
    return MemoryItem(**fields)  # type: ignore[arg-type]


ITEMS = [
    item("my automobile needs new tires"),
    item("we adopted a puppy named Biscuit"),
    item("the dentist appointment is on Friday"),
]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[VectorStore]:
    vectors = VectorStore(tmp_path / "vectors", WordsEmbedder())
    await vectors.start()
    yield vectors
    await vectors.close()


async def filled(folder: Path, embedder: WordsEmbedder, items: Sequence[MemoryItem]) -> VectorStore:
    store = VectorStore(folder, embedder)
    await store.start()
    store.submit(items)
    assert await store.drain() == 0
    return store


async def test_vectors_persist_and_load_without_embedding_again(tmp_path: Path) -> None:
    first = await filled(tmp_path / "vectors", WordsEmbedder(), ITEMS)
    before = await first.similarities("car service")
    await first.close()

    embedder = WordsEmbedder()
    second = VectorStore(tmp_path / "vectors", embedder)
    await second.start()
    assert second.count == 3 and embedder.calls == []
    assert second.submit(ITEMS) == 0 and second.pending == 0  # nothing to recompute
    after = await second.similarities("car service")
    assert embedder.calls == [["car service"]]  # only the query
    assert after == pytest.approx(before)
    assert max(after, key=after.__getitem__) == ITEMS[0].fingerprint
    await second.close()


async def test_a_model_removes_the_files_of_the_builds_it_replaces_and_refills(tmp_path: Path) -> None:
    folder = tmp_path / "vectors"
    old = await filled(folder, WordsEmbedder("words-v1"), ITEMS)
    await old.close()
    other = await filled(folder, WordsEmbedder("other-model"), ITEMS)  # an unrelated model's file stays
    await other.close()

    newer = WordsEmbedder("words-v2")
    newer.replaces = ("words-v1",)  # type: ignore[attr-defined]
    with capture_logs() as logs:
        store = await filled(folder, newer, ITEMS)
    assert not vector_file.file_for(folder, "words-v1").exists()
    assert vector_file.file_for(folder, "other-model").exists()
    assert store.count == 3 and newer.texts_embedded == 3  # embedded anew, in the background
    assert any(e["event"] == "vectors_replaced_build_removed" for e in logs)
    await store.close()


async def test_nearest_ranks_by_meaning_within_the_given_fingerprints(store: VectorStore) -> None:
    store.submit(ITEMS)
    await store.drain()
    best = await store.nearest("the puppy Biscuit", k=2)
    assert best[0][0] == ITEMS[1].fingerprint and len(best) == 2
    assert best[0][1] >= best[1][1]
    among = [ITEMS[0].fingerprint, ITEMS[2].fingerprint, "no-such-fingerprint"]
    assert {f for f, _ in await store.nearest("the puppy Biscuit", k=5, fingerprints=among)} == set(among[:2])
    scores = await store.similarities("automobile", [ITEMS[0].fingerprint])
    assert list(scores) == [ITEMS[0].fingerprint] and scores[ITEMS[0].fingerprint] > 0.3
    assert await store.nearest("the puppy Biscuit", k=0) == []


async def test_feedback_finds_what_the_nearest_items_talk_about_in_other_words(tmp_path: Path) -> None:
    seeds = [item("aquarium fish tank gravel"), item("aquarium fish tank plants")]
    answer = item("tank gravel plants tetras")  # not one word of the question
    other = item("dentist friday appointment")
    store = await filled(tmp_path / "vectors", WordsEmbedder(dim=256), [*seeds, answer, other])
    query = "aquarium fish count"
    plain = dict(await store.nearest(query, k=4))
    assert plain[answer.fingerprint] == 0.0 == plain[other.fingerprint]
    moved = dict(await store.nearest(query, k=4, feedback=Feedback(seeds=2, weight=0.5)))
    assert moved[answer.fingerprint] > 0.1 and moved[other.fingerprint] == 0.0
    assert min(moved[s.fingerprint] for s in seeds) > moved[answer.fingerprint]  # the words still lead
    # Only usable items steer the query: with the two seeds another chat's, nothing moves toward them.
    mine = {answer.fingerprint, other.fingerprint}
    fenced = dict(await store.nearest(query, k=4, feedback=Feedback(seeds=2, usable=mine.__contains__)))
    assert fenced == plain
    await store.close()


async def test_feedback_scores_again_only_what_the_query_found_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vector_search, "RESCORED", 3)  # a large memory, in small
    seeds = [item("aquarium fish tank gravel"), item("aquarium fish tank plants")]
    answer = item("tank gravel plants tetras")
    near = item("dentist count appointment")  # one word of the query: among its three nearest
    store = await filled(tmp_path / "vectors", WordsEmbedder(dim=256), [*seeds, answer, near])
    moved = dict(await store.nearest("aquarium fish count", k=4, feedback=Feedback(seeds=2)))
    assert set(moved) == {*(s.fingerprint for s in seeds), near.fingerprint}
    await store.close()


async def test_nearest_among_some_items_names_each_score_by_its_own_item(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows are scored by index and named only at the end: among a subset (given in any order, repeated,
    with fingerprints that have no vector) each score is its own item's, and feedback moves the query
    toward the subset's own nearest rows (worked out here by hand, the way the module doc says)."""
    monkeypatch.setattr(vector_search, "RESCORED", 4)  # a large memory, in small: the second pass re-ranks
    words = ["aquarium", "fish", "tank", "gravel", "plants", "tetras", "dentist", "friday", "garden", "basil"]
    pick = random.Random(7)
    everything = [item(" ".join(pick.choices(words, k=6)) + f" n{i}") for i in range(24)]
    embedder = WordsEmbedder(dim=256)
    store = await filled(tmp_path / "vectors", embedder, everything)
    some = everything[1::3]
    fingerprints = [i.fingerprint for i in some]
    asked = [fingerprints[3], "0" * 64, *fingerprints, fingerprints[0]]
    order = list(dict.fromkeys(asked[:1] + asked[2:]))  # as nearest() takes them: each once, first first
    rows = unit(np.array([embedder.vector(i.content) for i in some])).astype(np.float16).astype(np.float32)
    rows = rows[[fingerprints.index(f) for f in order]]
    for query in ("aquarium fish tank", "garden basil friday"):
        cosines = await store.similarities(query, fingerprints)
        plain = await store.nearest(query, 5, asked)
        assert all(cosines[f] == score for f, score in plain)
        assert [score for _, score in plain] == sorted(cosines.values(), reverse=True)[:5]

        q = unit(np.array([embedder.vector(query)]))[0]
        scores = rows @ q
        seeds = Feedback(seeds=2).pick(order, scores)
        moved = unit((q + 0.5 * rows[seeds].mean(axis=0))[None, :])[0]
        first = np.argsort(-scores, kind="stable")[:4]  # what the query found first, scored again
        expected = sorted(((order[i], float(rows[i] @ moved)) for i in first), key=lambda fs: -fs[1])
        found = await store.nearest(query, 5, asked, feedback=Feedback(seeds=2))
        assert [f for f, _ in found] == [f for f, _ in expected]
        assert [s for _, s in found] == pytest.approx([s for _, s in expected], abs=1e-5)
    await store.close()


def unit(matrix: np.ndarray) -> np.ndarray:
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def test_feedback_seeds_are_the_best_usable_items() -> None:
    keys = ["a", "b", "c", "d"]
    scores = np.array([0.9, 0.1, 0.8, 0.5], dtype=np.float32)
    assert sorted(Feedback(seeds=2).pick(keys, scores)) == [0, 2]
    assert Feedback(seeds=2, usable=lambda k: k != "a").pick(keys, scores) == [2, 3]
    assert Feedback(seeds=2, usable=lambda k: False).pick(keys, scores) == []
    assert Feedback(seeds=3, floor=0.6).pick(keys, scores) == [0, 2]  # nothing unrelated steers it


async def test_submit_skips_what_needs_no_vector(store: VectorStore) -> None:
    gone = item("forgotten words", deleted=True)
    blank = item("   ")
    odd = item("an item whose fingerprint was edited by hand", fingerprint="not a hash")
    assert store.submit([*ITEMS, ITEMS[0], gone, blank, odd]) == 3
    assert store.pending == 3
    await store.drain()
    assert store.submit(ITEMS) == 0 and store.count == 3


async def test_a_torn_tail_costs_only_the_torn_record(tmp_path: Path) -> None:
    folder = tmp_path / "vectors"
    store = await filled(folder, WordsEmbedder(), ITEMS[:2])
    store.submit(ITEMS[2:])
    await store.drain()
    await store.close()
    path = store.path
    size = path.stat().st_size
    with path.open("r+b") as f:  # a kill in the middle of the last append
        f.truncate(size - 20)

    embedder = WordsEmbedder()
    with capture_logs() as logs:
        reloaded = VectorStore(folder, embedder)
        await reloaded.start()
    assert reloaded.count == 2 and ITEMS[2].fingerprint not in reloaded
    assert any(e["event"] == "vectors_damaged" and e["torn_bytes"] > 0 for e in logs)
    assert reloaded.submit(ITEMS) == 1  # only the torn record is embedded again
    await reloaded.drain()
    await reloaded.close()
    assert path.stat().st_size == size  # the torn bytes were cut before the append

    again = VectorStore(folder, WordsEmbedder())
    await again.start()
    assert again.count == 3
    await again.close()


async def test_appends_are_fsynced_once_at_close_not_batch_by_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    store = await filled(tmp_path / "vectors", WordsEmbedder(), ITEMS[:1])  # creates the file: synced
    monkeypatch.setattr(os, "fsync", counting_fsync)
    for one in ITEMS[1:]:  # two batches, as two turns at a human pace make them
        store.submit([one])
        await store.drain()
    assert not [p for p in synced if p.endswith(vector_file.SUFFIX)]
    await store.close()
    assert [p for p in synced if p.endswith(vector_file.SUFFIX)] == [str(store.path)]


async def test_a_power_cut_that_zeroes_unsynced_records_costs_only_their_embedding(tmp_path: Path) -> None:
    folder = tmp_path / "vectors"
    store = await filled(folder, WordsEmbedder(), ITEMS)
    await store.close()
    record = vector_file.record_dtype(32).itemsize
    with store.path.open("r+b") as f:  # the last append's blocks never reached the disk: zeros
        f.seek(vector_file.HEADER_BYTES + 2 * record)
        f.write(b"\0" * record)
    embedder = WordsEmbedder()
    reloaded = VectorStore(folder, embedder)
    await reloaded.start()
    assert reloaded.count == 2 and ITEMS[2].fingerprint not in reloaded
    assert reloaded.submit(ITEMS) == 1
    await reloaded.drain()
    assert embedder.calls == [[ITEMS[2].content]]
    await reloaded.close()


async def test_a_damaged_record_is_skipped_and_the_rest_load(tmp_path: Path) -> None:
    folder = tmp_path / "vectors"
    store = await filled(folder, WordsEmbedder(), ITEMS)
    await store.close()
    record = vector_file.record_dtype(32).itemsize
    with store.path.open("r+b") as f:  # bit rot in the middle record's vector
        f.seek(vector_file.HEADER_BYTES + record + vector_file.KEY_BYTES)
        f.write(b"\xff" * 8)
    reloaded = VectorStore(folder, WordsEmbedder())
    await reloaded.start()
    assert reloaded.count == 2 and ITEMS[1].fingerprint not in reloaded
    await reloaded.close()


async def test_an_unreadable_file_is_set_aside_not_deleted(tmp_path: Path) -> None:
    folder = tmp_path / "vectors"
    folder.mkdir()
    path = vector_file.file_for(folder, "words-v1")
    path.write_bytes(b"not a vector file at all")
    store = VectorStore(folder, WordsEmbedder())
    with capture_logs() as logs:
        await store.start()
    assert store.count == 0 and any(e["event"] == "vectors_unreadable" for e in logs)
    assert (folder / (path.name + ".unreadable")).read_bytes() == b"not a vector file at all"
    store.submit(ITEMS)
    assert await store.drain() == 0 and store.count == 3
    await store.close()


async def test_a_folder_where_the_file_belongs_is_set_aside_and_the_vectors_made_again(
    tmp_path: Path,
) -> None:
    """A folder in the vector file's place stopped the start ("Is a directory"): it never becomes
    readable by itself, and the vectors are derived from the items."""
    folder = tmp_path / "vectors"
    path = vector_file.file_for(folder, "words-v1")
    (path / "kept").mkdir(parents=True)
    store = VectorStore(folder, WordsEmbedder())
    with capture_logs() as logs:
        await store.start()
    assert store.count == 0 and any(e["event"] == "vectors_unreadable" for e in logs)
    assert (folder / (path.name + ".unreadable") / "kept").is_dir()  # set aside, not deleted
    store.submit(ITEMS)
    assert await store.drain() == 0 and store.count == 3
    await store.close()


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


async def test_a_read_only_store_reads_a_file_being_appended_to_as_it_is_and_writes_nothing(
    tmp_path: Path,
) -> None:
    """`membot memory search` beside the bot: the bot's last record still being written (torn) is left
    out and left in place, a replaced build's file is not removed, and nothing is embedded."""
    folder = tmp_path / "vectors"
    for model in ("words-v1", "words-v2"):
        await (await filled(folder, WordsEmbedder(model), ITEMS[:2])).close()
    with vector_file.file_for(folder, "words-v2").open("ab") as f:
        f.write(b"half-a-record")
    before = folder_bytes(folder)
    embedder = WordsEmbedder("words-v2")
    embedder.replaces = ("words-v1",)  # type: ignore[attr-defined]
    reader = VectorStore(folder, embedder, read_only=True)
    with capture_logs() as logs:
        await reader.start()
    assert reader.count == 2 and not any(e["event"] == "vectors_damaged" for e in logs)
    assert [k for k, _ in await reader.nearest("automobile", k=1)] == [ITEMS[0].fingerprint]
    assert [reader.lacks(i) for i in ITEMS] == [False, False, True]
    with pytest.raises(RuntimeError, match="read-only"):
        reader.submit(ITEMS)
    with pytest.raises(RuntimeError, match="read-only"):
        await reader.reset()
    await reader.close()
    assert embedder.calls == [["automobile"]]  # the query alone
    assert folder_bytes(folder) == before


async def test_a_reader_sees_one_whole_file_when_the_bot_rewrites_it_midway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`membot memory search` opens the file just before the bot replaces it (another dimension): the
    reader gets the file it opened, header and records alike, not one's header and the other's records
    (read as damaged records)."""
    folder = tmp_path / "vectors"
    await (await filled(folder, WordsEmbedder(), ITEMS[:2])).close()
    path = vector_file.file_for(folder, "words-v1")
    rows = np.eye(64, dtype=np.float16)[:3]
    real_open = Path.open
    swapped: list[Path] = []

    def open_then_swap(self: Path, *args: Any, **kwargs: Any) -> Any:
        opened = real_open(self, *args, **kwargs)
        if self == path and not swapped:  # the bot's rewrite lands right after the reader's open
            swapped.append(self)
            vector_file.rewrite(path, "words-v1", 64, [i.fingerprint for i in ITEMS], rows)
        return opened

    monkeypatch.setattr(Path, "open", open_then_swap)
    reader = VectorStore(folder, WordsEmbedder(), read_only=True)
    with capture_logs() as logs:
        await reader.start()
    monkeypatch.undo()
    assert swapped and not [e for e in logs if e["log_level"] == "warning"]
    assert reader.count == 2 and [reader.lacks(i) for i in ITEMS] == [False, False, True]
    await reader.close()


async def test_a_read_only_store_leaves_an_unreadable_file_where_it_is(tmp_path: Path) -> None:
    folder = tmp_path / "vectors"
    folder.mkdir()
    path = vector_file.file_for(folder, "words-v1")
    path.write_bytes(vector_file.header("words-v1", 32)[:100])  # a header still being written
    reader = VectorStore(folder, WordsEmbedder(), read_only=True)
    with capture_logs() as logs:
        await reader.start()
    assert reader.count == 0 and any(e["event"] == "vectors_unreadable" for e in logs)
    await reader.close()
    assert folder_bytes(folder) == {path.name: vector_file.header("words-v1", 32)[:100]}


async def test_a_query_the_model_cannot_embed_says_why(tmp_path: Path) -> None:
    """What `membot memory search` prints when it found by words only because the model failed."""
    store = await filled(tmp_path / "vectors", WordsEmbedder(), ITEMS)
    store.embedder.fail = 1  # type: ignore[attr-defined]
    assert await store.nearest("anything new", k=3) == [] and store.query_failure is not None
    assert "LLMUnavailable: embeddings endpoint unreachable" in store.query_failure
    assert await store.nearest("car", k=3) and store.query_failure is None
    await store.close()


async def test_a_new_model_starts_its_own_file_and_the_old_one_stays(tmp_path: Path) -> None:
    folder = tmp_path / "vectors"
    await (await filled(folder, WordsEmbedder("words-v1"), ITEMS)).close()

    v2 = WordsEmbedder("words-v2", dim=16)
    store = VectorStore(folder, v2)
    await store.start()
    assert store.count == 0
    assert store.submit(ITEMS) == 3  # a model change re-embeds everything, once
    await store.drain()
    await store.close()
    assert v2.texts_embedded == 3

    v1 = WordsEmbedder("words-v1")
    back = VectorStore(folder, v1)
    await back.start()
    assert back.count == 3 and back.submit(ITEMS) == 0 and v1.calls == []
    await back.close()
    assert len(list(folder.glob("*.vec"))) == 2


async def test_the_same_model_id_with_another_dimension_starts_over(tmp_path: Path) -> None:
    folder = tmp_path / "vectors"
    await (await filled(folder, WordsEmbedder(dim=32), ITEMS)).close()
    store = VectorStore(folder, WordsEmbedder(dim=16))
    await store.start()
    store.submit([item("a brand new memory")])
    with capture_logs() as logs:
        await store.drain()
    assert any(e["event"] == "vectors_dimension_changed" for e in logs)
    assert store.count == 1 and store.submit(ITEMS) == 3
    await store.drain()
    await store.close()
    assert await asyncio.to_thread(vector_file.read_header, store.path, "words-v1") == 16


async def test_an_empty_file_of_another_dimension_is_started_again(tmp_path: Path) -> None:
    store = await filled(tmp_path / "vectors", WordsEmbedder(dim=32), ITEMS)
    await store.reset()  # header only, 32 dimensions
    await store.close()
    other = VectorStore(tmp_path / "vectors", WordsEmbedder(dim=16))
    await other.start()
    other.submit(ITEMS)
    assert await other.drain() == 0 and other.count == 3
    await other.close()


async def test_freed_memory_goes_back_once_the_worker_is_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    released = asyncio.Event()
    calls: list[int] = []

    def release() -> bool:  # the real one, observed
        calls.append(1)
        released.set()
        return release_free_memory()

    monkeypatch.setattr(vectors, "release_free_memory", release)
    monkeypatch.setattr(vectors, "IDLE_TRIM", 0.05)
    store = VectorStore(tmp_path / "vectors", WordsEmbedder())
    await store.start()
    await asyncio.sleep(0.2)
    assert not calls  # nothing embedded yet: nothing to give back
    store.submit(ITEMS[:1])
    await store.drain()
    async with asyncio.timeout(5):
        await released.wait()
    await asyncio.sleep(0.2)
    assert len(calls) == 1  # once per quiet spell, not every IDLE_TRIM
    store.submit(ITEMS[1:2])  # new work, then quiet again: once more
    await store.drain()
    async with asyncio.timeout(5):
        while len(calls) < 2:
            await asyncio.sleep(0.01)
    await store.close()


async def test_the_queue_never_blocks_the_caller(tmp_path: Path) -> None:
    embedder = WordsEmbedder()
    store = await filled(tmp_path / "vectors", embedder, ITEMS[:1])
    late = [item("a long text the model chews on for a while"), item("and another one")]
    embedder.slow = {late[0].content}

    assert store.submit(late) == 2  # returns at once, the model is still busy
    assert store.pending == 2 and store.count == 1
    await embedder.entered_slow.wait()  # the worker has taken the batch and is stuck in the model
    scores = await store.similarities("automobile")  # a reply's retrieval goes on meanwhile
    assert list(scores) == [ITEMS[0].fingerprint]

    embedder.release.set()
    assert await store.drain() == 0 and store.count == 3
    await store.close()


async def test_items_written_turn_after_turn_are_embedded_together_once_they_pause(tmp_path: Path) -> None:
    embedder = WordsEmbedder()
    store = VectorStore(tmp_path / "vectors", embedder, settle=0.05, max_wait=5.0)
    await store.start()
    for n in range(5):  # five turns, 10 ms apart: the model stays off the CPU meanwhile
        store.submit([item(f"message number {n} about bikes")])
        await asyncio.sleep(0.01)
    assert embedder.calls == []
    while store.pending:  # then, once they pause, one batch
        await asyncio.sleep(0.01)
    assert [len(call) for call in embedder.calls] == [5]
    store.submit([item("one more")])
    assert await store.drain() == 0  # drain() does not wait for a pause
    await store.close()


async def test_close_is_bounded_while_the_model_is_stuck(tmp_path: Path) -> None:
    embedder = WordsEmbedder()
    store = VectorStore(tmp_path / "vectors", embedder)
    await store.start()
    stuck = item("this one never finishes")
    embedder.slow = {stuck.content}
    store.submit([stuck])
    await store.close(timeout=0.05)
    assert store.pending == 1  # left for the next start's submit, not lost: it has no vector on disk


@pytest.mark.parametrize("ticks", range(5))
async def test_a_stop_that_lands_as_the_worker_wakes_is_not_lost(tmp_path: Path, ticks: int) -> None:
    """close() cancels the worker; on Python 3.11 a cancel that landed while the worker's wait for more
    items was finishing (asyncio.wait_for) was swallowed, and close() then waited forever (seen as a
    bot that answered everything and never stopped). Each tick count puts the cancel at another step."""
    store = VectorStore(tmp_path / "vectors", WordsEmbedder(), settle=5.0, max_wait=30.0)
    await store.start()
    store.submit([item("first words")])
    for _ in range(5):
        await asyncio.sleep(0)  # the worker now waits for more items to batch with it
    store.submit([item("second words")])  # ...which wakes it
    for _ in range(ticks):
        await asyncio.sleep(0)
    worker = store._worker
    assert worker is not None
    worker.cancel()  # what close() does
    async with asyncio.timeout(2):
        await asyncio.gather(worker, return_exceptions=True)
    assert worker.cancelled()
    store._worker = None  # (stopped above)


async def test_close_drains_the_queue(tmp_path: Path) -> None:
    store = VectorStore(tmp_path / "vectors", WordsEmbedder())
    await store.start()
    store.submit(ITEMS)
    await store.close()
    reloaded = VectorStore(tmp_path / "vectors", WordsEmbedder())
    await reloaded.start()
    assert reloaded.count == 3
    await reloaded.close()


async def test_a_failing_embedder_is_logged_once_and_retried(tmp_path: Path) -> None:
    embedder = WordsEmbedder()
    store = VectorStore(tmp_path / "vectors", embedder, retry_after=0.001)
    await store.start()
    embedder.fail = 3
    with capture_logs() as logs:
        store.submit(ITEMS)
        assert await store.drain() == 3  # stops waiting at the first failure
        assert store.last_error and "unreachable" in store.last_error
        await embedder.succeeded.wait()
        await store.drain()
    assert store.count == 3 and store.pending == 0 and store.last_error is None
    events = [e["event"] for e in logs]
    assert events.count("vectors_embedding_failed") == 1
    assert events.count("vectors_embedding_recovered") == 1
    await store.close()


async def test_a_query_while_the_endpoint_is_down_gets_no_scores_not_an_error(store: VectorStore) -> None:
    store.submit(ITEMS)
    await store.drain()
    store.embedder.fail = 2  # type: ignore[attr-defined]
    assert await store.similarities("anything new") == {}
    assert await store.nearest("anything new", k=3) == []
    assert len(await store.similarities("car")) == 3


async def test_a_prefetched_query_is_embedded_once_and_a_stopped_turn_does_not_cancel_it(
    store: VectorStore,
) -> None:
    store.submit(ITEMS)
    await store.drain()
    embedder: WordsEmbedder = store.embedder  # type: ignore[assignment]
    embedder.calls.clear()
    embedder.slow = {"my car"}
    store.prefetch("my car")
    await embedder.entered_slow.wait()  # the model is on it before anyone asks
    stopped = asyncio.create_task(store.nearest("my car", k=1))
    waiting = asyncio.create_task(store.nearest("my car", k=1))
    await asyncio.sleep(0)
    stopped.cancel()  # /stop on one turn: the other still gets the vector being made
    embedder.release.set()
    assert [key for key, _ in await waiting] == [ITEMS[0].fingerprint]
    assert stopped.cancelled()
    assert await store.nearest("my car", k=1) == await waiting  # from the cache
    assert embedder.calls == [["my car"]]


async def test_a_slow_query_vector_is_not_waited_for_but_kept_when_it_comes(tmp_path: Path) -> None:
    embedder = WordsEmbedder()
    store = VectorStore(tmp_path / "vectors", embedder, query_wait=0.1)
    await store.start()
    store.submit(ITEMS)
    await store.drain()
    embedder.slow = {"my car"}
    with capture_logs() as logs:
        async with asyncio.timeout(10):
            assert await store.nearest("my car", k=1) == []  # the turn goes on with words alone
    assert [e["event"] for e in logs] == ["vectors_query_embedding_slow"]
    embedder.succeeded.clear()
    embedder.release.set()
    await embedder.succeeded.wait()  # the vector comes after all, and is kept
    assert [key for key, _ in await store.nearest("my car", k=1)] == [ITEMS[0].fingerprint]
    assert embedder.calls[-1] == ["my car"] and embedder.calls.count(["my car"]) == 1
    await store.close()


async def test_two_writers_share_one_file(tmp_path: Path) -> None:
    folder = tmp_path / "vectors"
    bot = await filled(folder, WordsEmbedder(), ITEMS[:1])
    importer = await filled(folder, WordsEmbedder(), ITEMS[1:2])  # `membot memory import` next to the bot
    assert importer.count == 2  # it loaded the bot's vector
    bot.submit(ITEMS[2:])
    await bot.drain()
    assert bot.count == 3  # and the bot picked up the importer's on its next append
    await bot.close()
    await importer.close()
    reloaded = VectorStore(folder, WordsEmbedder())
    await reloaded.start()
    assert reloaded.count == 3
    await reloaded.close()


async def test_compact_drops_vectors_of_forgotten_items(tmp_path: Path) -> None:
    folder = tmp_path / "vectors"
    store = await filled(folder, WordsEmbedder(), ITEMS)
    assert await store.compact({i.fingerprint for i in ITEMS}) == 0  # nothing dead
    assert await store.compact({ITEMS[0].fingerprint}) == 2
    assert store.count == 1
    other = VectorStore(folder, WordsEmbedder())
    await other.start()
    assert other.count == 1
    store.submit([item("written after the compaction")])
    await store.drain()
    other.submit([item("written by the other process")])
    await other.drain()
    assert other.count == 3  # it noticed the rewrite and re-read the file before appending
    await store.close()
    await other.close()


async def test_reset_forgets_this_models_vectors(store: VectorStore) -> None:
    store.submit(ITEMS)
    await store.drain()
    await store.reset()
    assert store.count == 0 and store.submit(ITEMS) == 3


async def test_startup_with_many_vectors_does_not_embed(tmp_path: Path) -> None:
    folder = tmp_path / "vectors"
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((5000, 32)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    keys = [f"{i:024x}" for i in range(5000)]
    path = vector_file.file_for(folder, "words-v1")
    await asyncio.to_thread(vector_file.rewrite, path, "words-v1", 32, keys, rows.astype(np.float16))
    embedder = WordsEmbedder()
    store = VectorStore(folder, embedder)
    await store.start()
    assert store.count == 5000 and embedder.calls == []
    top = await store.nearest("car", k=10)
    assert len(top) == 10 and [s for _, s in top] == sorted((s for _, s in top), reverse=True)
    await store.close()


WRITER = """
import sys
from pathlib import Path
import numpy as np
from bot.memory import vector_file, vectors

path = Path(sys.argv[1])
rng = np.random.default_rng(1)
end = inode = 0
for batch in range(100000):
    rows = rng.standard_normal((256, 32)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    keys = [f"{batch:012x}{i:012x}" for i in range(256)]
    done = vector_file.append(path, "words-v1", keys, rows.astype(np.float16), end, inode)
    end, inode = done.end, done.inode
    print(batch, flush=True)  # acknowledged: durable on disk
"""


def test_a_writer_killed_mid_append_loses_nothing_it_acknowledged(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    folder = tmp_path / "vectors"
    path = vector_file.file_for(folder, "words-v1")
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )
    assert child.stdout is not None
    acknowledged = [child.stdout.readline() for _ in range(20)]
    os.kill(child.pid, signal.SIGKILL)  # while it keeps appending
    child.wait()
    child.stdout.close()
    assert all(line.strip() for line in acknowledged)

    async def reload() -> int:
        store = VectorStore(folder, WordsEmbedder())
        await store.start()
        store.submit(ITEMS)
        assert await store.drain() == 0  # appending after the kill works (a torn tail is cut first)
        await store.close()
        again = VectorStore(folder, WordsEmbedder())
        await again.start()
        assert all(i.fingerprint in again for i in ITEMS)
        await again.close()
        return again.count

    count = asyncio.run(reload())
    assert count >= 20 * 256 + len(ITEMS)
    record = vector_file.record_dtype(32).itemsize
    assert (path.stat().st_size - vector_file.HEADER_BYTES) % record == 0
