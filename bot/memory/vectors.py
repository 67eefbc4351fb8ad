"""VectorStore: one embedding per memory item, computed once in the background, kept on disk, scored by numpy.

Why: re-embedding the whole memory at every start cost 21.7 s for 660 turns, and scoring in Python 1 s per
query at 20,000 items. Here an item is embedded once, when it is written, by one background worker that
batches and never delays a reply; its vector is appended to ``<folder>/<model id>.vec`` (see
``vector_file.py``) and loaded at the next start without recomputation. Vectors are keyed by the item's
fingerprint (a hash of its type and content), so versions of an item that only touch its salience or
last use share one vector, and an edit gets a new one. Each embedding model has its own file: changing
``memory.embeddings_local_model`` starts an empty one, which fills as items are submitted again (at
start-up, or all at once with ``membot memory reindex``).

Use::

    store = VectorStore(memory_dir / "vectors", embedder)
    await store.start()                      # loads the model's file (100,000 vectors: well under 1 s)
    store.submit(item_store.items())         # queues what has no vector yet; returns at once
    scores = await store.similarities("when is the trip?", [i.fingerprint for i in candidates])
    best = await store.nearest("when is the trip?", k=50)   # [(fingerprint, cosine), ...]
    await store.close()                      # finishes the queue (bounded), stops the worker

A failing embedder (an endpoint down, a missing package) never fails a turn: the failure is logged once,
queries get no semantic scores, and the worker retries the queue later with a growing delay. A slow one
never holds a turn for long either: a query waits for its vector at most ``QUERY_WAIT`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Protocol

import numpy as np
import structlog
from numpy.typing import NDArray

from bot.allocator import release_free_memory
from bot.memory import vector_file
from bot.memory.embeddings import EMBED_CHARS, Embedder
from bot.memory.items import MemoryItem
from bot.retry import Backoff

log = structlog.get_logger(__name__)

VECTORS_DIR = "vectors"  # under the memory folder
BATCH = 64  # texts per embedder call
SETTLE = 0.25  # seconds without new items before the queue is embedded
MAX_WAIT = 2.0  # seconds a queued item waits at most while items keep arriving
THREAD_SCORING_ROWS = 20_000  # above this many rows a query is scored in a worker thread
QUERY_CACHE = 256  # recent query vectors kept: a message is the query, then an item to embed
LOOKED_AT = 64  # nearest items among which feedback looks for its seeds
RESCORED = 2_000  # nearest items feedback scores again (a second pass over 100,000 rows costs ~9 ms)
IDLE_TRIM = 1.0  # seconds without new items after a batch before freed memory goes back to the system
# Seconds a turn waits for its query's vector. The bundled model makes one in milliseconds (its first
# load takes some 0.3 s), an endpoint in well under a second; one that is slow or stuck held the reply
# for as long as it took (for a server sending a byte now and then: until the turn's own timeout).
# Past this the turn goes on with words alone; the vector, if it comes, is kept for the next time.
QUERY_WAIT = 5.0

Progress = Callable[[int, int], None]  # (done, total)


class Keys(Protocol):
    """The key of each scored row, by its position (a list, or rows named when asked)."""

    def __getitem__(self, i: int, /) -> str: ...


@dataclass(frozen=True, slots=True)
class Feedback:
    """Pseudo-relevance feedback in meaning (Rocchio): the query's vector is moved toward the mean of its
    ``seeds`` nearest items by ``weight`` and scored again.

    Why: a question shares few words and only part of its meaning with the message that answers it
    ("how many fish in my aquariums?" / "my 20-gallon tank has 10 neon tetras"), while its nearest items
    are about the same thing in the user's own words; moving toward them finds their neighbours. On the
    open subset (any seeds from 2 to 10, weight 0.3 to 1.0) session recall_all@5 went from 0.940 to
    0.964-0.976 and turn recall_any@5 from 0.940 to 0.940-0.952, at the cost of a second scoring pass
    over the query's ``RESCORED`` nearest items.
    ``usable`` keeps seeds to what the asker may see (chat scope): another chat's items never steer it.
    """

    seeds: int = 3
    weight: float = 0.5
    floor: float = 0.2  # a seed is at least this near the query (unrelated texts score ~0)
    usable: Callable[[str], bool] | None = None  # by fingerprint

    def pick(self, keys: Keys, scores: NDArray[np.float32]) -> list[int]:
        """Indices of the seeds: the best-scored keys that are usable and near enough, among the
        ``LOOKED_AT`` best (no seeds if none of those is usable: the query is then scored as it is)."""
        out: list[int] = []
        best = np.argpartition(-scores, LOOKED_AT - 1)[:LOOKED_AT] if len(scores) > LOOKED_AT else None
        order = np.argsort(-scores if best is None else -scores[best], kind="stable")
        for i in order if best is None else best[order]:
            if scores[i] < self.floor:
                break
            if self.usable is None or self.usable(keys[int(i)]):
                out.append(int(i))
                if len(out) == self.seeds:
                    break
        return out


class _Matrix:
    """Unit rows (float32, as scored) with a key per row; a repeated key overwrites its row.

    Built from a file's records in a thread, adopting their array (100,000 rows are ~150 MB), then
    grown by :meth:`add`. Room is made ahead with :meth:`reserve`, also in a thread, so the event loop
    never copies the matrix; a scoring thread that holds the old array keeps a valid view of it.
    """

    def __init__(self, keys: list[str] | None = None, vectors: NDArray[np.float32] | None = None) -> None:
        keys = keys or []
        self.rows: dict[str, int] = dict(zip(keys, range(len(keys)), strict=True))  # last one wins
        self._data: NDArray[np.float32] | None = None
        if vectors is None or not keys:
            self.keys: list[str] = []
            return
        if len(self.rows) != len(keys):
            picked = np.fromiter(self.rows.values(), dtype=np.int64, count=len(self.rows))
            keys, vectors = list(self.rows), vectors[picked]
            self.rows = dict(zip(keys, range(len(keys)), strict=True))
        self.keys = list(keys)
        self._data = np.ascontiguousarray(vectors, dtype=np.float32)  # full: the first add grows it

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def dim(self) -> int | None:
        return None if self._data is None else self._data.shape[1]

    def view(self) -> NDArray[np.float32]:
        assert self._data is not None
        return self._data[: len(self.keys)]

    def pick(self, keys: Iterable[str]) -> NDArray[np.int64]:
        """The rows of ``keys`` that have one, in their first order, each once."""
        rows = self.rows
        found = [row for key in dict.fromkeys(keys) if (row := rows.get(key)) is not None]
        return np.array(found, dtype=np.int64)

    def reserve(self, extra: int, dim: int) -> None:
        """Make room for ``extra`` more rows of ``dim`` (blocking: the copy of a large matrix)."""
        if self._data is None or self._data.shape[1] != dim:
            self.keys, self.rows = [], {}
            self._data = np.empty((_capacity(extra), dim), dtype=np.float32)
        elif len(self.keys) + extra > len(self._data):
            grown = np.empty((_capacity(len(self.keys) + extra), dim), dtype=np.float32)
            grown[: len(self.keys)] = self._data[: len(self.keys)]
            self._data = grown

    def add(self, keys: list[str], vectors: NDArray[np.float32]) -> None:
        if not keys:
            return
        self.reserve(len(keys), vectors.shape[1])  # a no-op when the caller reserved already
        assert self._data is not None
        for key, vector in zip(keys, vectors, strict=True):
            row = self.rows.get(key)
            if row is None:
                row = len(self.keys)
                self._data[row] = vector  # the row first, then the key: a reader never sees a blank row
                self.keys.append(key)
                self.rows[key] = row
            else:
                self._data[row] = vector


def _capacity(rows: int) -> int:
    return max(1024, rows + rows // 4)


class VectorStore:
    """Persistent, background-filled vectors for memory items of one embedding model.

    ``folder`` holds one file per model id (``embedder.model_id``). ``batch`` texts go to the embedder at
    a time; after a failure the worker waits ``retry_after`` seconds, doubling up to ``max_retry_after``.
    A query waits at most ``query_wait`` seconds for its vector (:data:`QUERY_WAIT`).
    """

    def __init__(
        self,
        folder: Path,
        embedder: Embedder,
        *,
        batch: int = BATCH,
        retry_after: float = 5.0,
        max_retry_after: float = 300.0,
        settle: float = SETTLE,
        max_wait: float = MAX_WAIT,
        query_wait: float = QUERY_WAIT,
    ) -> None:
        self.folder = folder
        self.embedder = embedder
        self.model_id = embedder.model_id
        self.path = vector_file.file_for(folder, self.model_id)
        self._batch = batch
        self._retry_after = retry_after
        self._max_retry_after = max_retry_after
        self._settle = settle
        self._max_wait = max_wait
        self._query_wait = query_wait
        self._hurry = False  # drain() wants the queue embedded now
        self._matrix = _Matrix()
        self._end = 0
        self._inode = 0
        self._queue: dict[str, str] = {}  # fingerprint -> text, oldest first
        self._wake = asyncio.Event()
        self._progress = asyncio.Condition()
        self._worker: asyncio.Task[None] | None = None
        self._write = asyncio.Lock()  # one file operation at a time in this process
        self._failures = 0  # consecutive failed batches; 0 while healthy
        self._failure_events = 0  # every failed batch, ever (drain stops at a new one)
        self.last_error: str | None = None
        self._queries: OrderedDict[str, NDArray[np.float32]] = OrderedDict()
        self._embedding: dict[str, asyncio.Task[NDArray[np.float32] | None]] = {}  # queries in the model

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load this model's vectors (no embedding happens here) and start the background worker.

        The files of the builds this model replaces (``embedder.replaces``: the same model run another
        way, whose vectors nothing will read again) are removed; their items are embedded anew as they
        are submitted."""
        for old in getattr(self.embedder, "replaces", ()):
            stale = vector_file.file_for(self.folder, old)
            if await asyncio.to_thread(_remove, stale):
                log.info("vectors_replaced_build_removed", model=self.model_id, removed=stale.name)
        await self._load()
        if self._worker is None:
            self._worker = asyncio.create_task(self._work(), name="memory-vectors")

    async def _load(self) -> None:
        try:
            loaded = await asyncio.to_thread(self._read)
        except vector_file.VectorFileError as exc:
            moved = self.path.with_name(self.path.name + ".unreadable")
            await asyncio.to_thread(self.path.replace, moved)
            log.warning("vectors_unreadable", file=self.path.name, moved_to=moved.name, error=str(exc))
            return
        if loaded is None:
            return
        records, matrix = loaded
        self._replace(records, matrix)
        if records.skipped or records.torn:
            log.warning(
                "vectors_damaged",
                file=self.path.name,
                skipped_records=records.skipped,
                torn_bytes=records.torn,
            )
        log.info("vectors_loaded", model=self.model_id, count=len(self._matrix))

    def _read(self) -> tuple[vector_file.Records, _Matrix] | None:
        if not self.path.exists():
            return None
        records = vector_file.read(self.path, self.model_id)[1]
        return records, _Matrix(records.keys, records.vectors)

    def _replace(self, records: vector_file.Records, matrix: _Matrix) -> None:
        self._matrix = matrix
        self._end, self._inode = records.end, records.inode
        self._queries.clear()

    async def close(self, timeout: float = 10.0) -> None:
        """Embed what is queued (for at most ``timeout`` seconds, and not while failing), then stop.

        Whatever is left is not lost: its items have no vector on disk, so the next start's
        :meth:`submit` of every item queues them again. The same holds for vectors a power cut takes
        before this close's fsync (see vector_file.py).
        """
        if self._worker is None:
            return
        if not self._failures:  # while failing, the next retry may be minutes away
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.drain()
        self._worker.cancel()
        for task in list(self._embedding.values()):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._worker
        self._worker = None
        await asyncio.to_thread(vector_file.sync, self.path)  # appends are not fsynced one by one
        async with self._progress:  # anyone still in drain() stops waiting
            self._progress.notify_all()
        if self._queue:
            log.info("vectors_left_queued", count=len(self._queue))

    # -- writing ------------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """Vectors held for this model."""
        return len(self._matrix)

    @property
    def pending(self) -> int:
        """Items queued for embedding (for /status)."""
        return len(self._queue)

    def __contains__(self, fingerprint: object) -> bool:
        return fingerprint in self._matrix.rows

    def submit(self, items: Iterable[MemoryItem]) -> int:
        """Queue the live items that have no vector yet; return how many were added. Never waits."""
        added = 0
        for item in items:
            key = item.fingerprint
            if item.deleted or key in self._matrix.rows or key in self._queue or not item.content.strip():
                continue
            if not vector_file.valid_key(key):
                log.warning("vectors_bad_fingerprint", item_id=item.id)
                continue
            self._queue[key] = item.content[:EMBED_CHARS]
            added += 1
        if added:
            self._wake.set()
        return added

    async def drain(self, progress: Progress | None = None) -> int:
        """Wait until the queue is empty or the embedder fails again; return what is still queued.

        ``progress(done, total)`` is called after every batch (``membot memory reindex`` draws its bar
        with it).
        """
        total = len(self._queue)
        self._hurry = True
        self._wake.set()
        async with self._progress:
            failures = self._failure_events
            while self._queue and self._worker is not None:
                await self._progress.wait()
                if self._failure_events != failures:
                    break
                if progress is not None:
                    progress(total - len(self._queue), total)
        return len(self._queue)

    async def _work(self) -> None:
        embedded = False  # since the allocator last gave memory back
        while True:
            if embedded and not await self._woken_within(IDLE_TRIM):
                # Quiet now: the model's activations are free but still resident (bot/allocator.py).
                await asyncio.to_thread(release_free_memory)
                embedded = False
                continue
            await self._wake.wait()
            self._wake.clear()
            await self._gather()
            embedded = embedded or bool(self._queue)
            while self._queue:
                batch = list(islice(self._queue.items(), self._batch))
                try:
                    vectors = await self._embed([text for _, text in batch])
                    if len(vectors) != len(batch):
                        raise ValueError(f"asked for {len(batch)} embeddings, got {len(vectors)}")
                    await self._store([key for key, _ in batch], vectors)
                except Exception as exc:  # a background worker must outlive any failure; it logs it
                    await self._failed(exc)
                    await asyncio.sleep(self._delay())
                    continue
                for key, _ in batch:
                    self._queue.pop(key, None)
                if self._failures:
                    log.info("vectors_embedding_recovered", model=self.model_id, failures=self._failures)
                    self._failures, self.last_error = 0, None
                async with self._progress:
                    self._progress.notify_all()

    async def _woken_within(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the wake event (left set for the caller); whether it came."""
        try:
            async with asyncio.timeout(seconds):  # not wait_for: see _gather
                await self._wake.wait()
        except TimeoutError:
            return False
        return True

    async def _gather(self) -> None:
        """Wait until items stop arriving for ``settle`` seconds (at most ``max_wait``): a burst is
        embedded as one batch, cheaper per text than one call each, and the model stays off the CPU
        while the turns that wrote them are still being answered. ``drain()`` cuts the wait short."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_wait
        while not self._hurry and (left := deadline - loop.time()) > 0:
            try:
                # Not wait_for (banned in pyproject): on Python 3.11 it returns normally when it is
                # cancelled just as the event fires, and close() then waited forever on this worker.
                async with asyncio.timeout(min(self._settle, left)):
                    await self._wake.wait()
            except TimeoutError:
                return  # quiet
            self._wake.clear()
        self._hurry = False

    async def _embed(self, texts: list[str]) -> NDArray[np.float32]:
        """Unit vectors for ``texts``; one the bot just asked with (a user's message is both the query and
        then an item) is taken from the query cache instead of being embedded twice."""
        known = {i: self._queries[t.strip()] for i, t in enumerate(texts) if t.strip() in self._queries}
        rest = [t for i, t in enumerate(texts) if i not in known]
        fresh = _unit(await self.embedder.embed(rest)) if rest else np.zeros((0, 0), dtype=np.float32)
        if not known:
            return fresh
        rows = iter(fresh)
        return np.stack([known[i] if i in known else next(rows) for i in range(len(texts))])

    async def _failed(self, exc: Exception) -> None:
        self._failures += 1
        self._failure_events += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self._failures == 1:  # once per outage; the recovery is logged too
            log.warning(
                "vectors_embedding_failed",
                model=self.model_id,
                error=self.last_error,
                queued=len(self._queue),
                retry_in=self._delay(),
            )
        async with self._progress:
            self._progress.notify_all()

    def _delay(self) -> float:
        return Backoff(self._retry_after, self._max_retry_after)(self._failures - 1)

    async def _store(self, keys: list[str], vectors: NDArray[np.float32]) -> None:
        halves = vectors.astype(np.float16)
        async with self._write:
            if self._matrix.dim not in (None, halves.shape[1]):
                old = self._matrix.dim
                log.warning("vectors_dimension_changed", model=self.model_id, old=old, new=halves.shape[1])
                await self._rewrite([], halves[:0])
            done = await asyncio.to_thread(
                vector_file.append, self.path, self.model_id, keys, halves, self._end, self._inode
            )
            others = done.others
            if others is not None and done.replaced:
                rebuilt = await asyncio.to_thread(_Matrix, others.keys, others.vectors)
                self._replace(others, rebuilt)
            elif others is not None:
                await asyncio.to_thread(self._matrix.reserve, len(others.keys), halves.shape[1])
                self._matrix.add(others.keys, others.vectors)
            await asyncio.to_thread(self._matrix.reserve, len(keys), halves.shape[1])
            self._matrix.add(keys, halves.astype(np.float32))  # as a reload will read them back
            self._end, self._inode = done.end, done.inode

    async def _rewrite(self, keys: list[str], vectors: NDArray[np.float16]) -> None:
        """Replace this model's file with exactly these vectors (caller holds ``_write``)."""
        end, inode = await asyncio.to_thread(
            vector_file.rewrite, self.path, self.model_id, vectors.shape[1], keys, vectors
        )
        rows = vectors.astype(np.float32)
        self._replace(vector_file.Records(keys, rows, end, inode), _Matrix(keys, rows))

    async def compact(self, live: Collection[str]) -> int:
        """Drop the vectors of fingerprints not in ``live`` once they are at least half the file.

        Returns how many were dropped (0 when it was not worth a rewrite). Run it from maintenance.
        """
        async with self._write:
            dead = len(self._matrix) - sum(1 for key in self._matrix.keys if key in live)
            if not dead or dead * 2 < len(self._matrix):
                return 0
            keep = [key for key in self._matrix.keys if key in live]
            rows = self._matrix.view()[[self._matrix.rows[k] for k in keep]].astype(np.float16)
            await self._rewrite(keep, rows)
        log.info("vectors_compacted", model=self.model_id, dropped=dead, kept=len(keep))
        return dead

    async def reset(self) -> None:
        """Forget every vector of this model (``membot memory reindex --full``)."""
        async with self._write:
            if self._matrix.dim is not None:
                empty = np.zeros((0, self._matrix.dim), dtype=np.float16)
                await self._rewrite([], empty)

    # -- reading ------------------------------------------------------------------------------------

    async def similarities(self, query: str, fingerprints: Iterable[str] | None = None) -> dict[str, float]:
        """Cosine of ``query`` with each fingerprint that has a vector (all of them for ``None``).

        Empty when there are no vectors or the query cannot be embedded (logged once per outage).
        """
        q = await self._query(query)
        if q is None:
            return {}
        matrix = self._matrix
        keys = matrix.keys  # rows are only ever appended (or overwritten in place): indices hold
        picked = None if fingerprints is None else matrix.pick(fingerprints)
        scores = await self._score(matrix.view(), q, picked)
        named = keys[: len(scores)] if picked is None else [keys[i] for i in picked.tolist()]
        return dict(zip(named, scores.tolist(), strict=True))

    async def nearest(
        self,
        query: str,
        k: int,
        fingerprints: Iterable[str] | None = None,
        *,
        feedback: Feedback | None = None,
        admits: Callable[[str], bool] | None = None,
    ) -> list[tuple[str, float]]:
        """The ``k`` fingerprints most similar to ``query`` (among ``fingerprints``; only those
        ``admits``, asked of the best until ``k`` pass), best first; with ``feedback``, to the query
        moved toward its nearest items (see :class:`Feedback`).

        Rows are handled as index arrays and named only for the ``k`` returned: naming every scored
        row (a list of keys per pass, and a dict look-up per key to score again) was most of its time
        on the event loop's thread."""
        q = await self._query(query)
        if q is None or k <= 0:
            return []
        matrix = self._matrix
        keys = matrix.keys  # rows are only ever appended (or overwritten in place): indices hold
        rows = matrix.view()
        picked = None if fingerprints is None else matrix.pick(fingerprints)
        scores = await self._score(rows, q, picked)
        if feedback is not None and feedback.seeds > 0:
            seeds = feedback.pick(_Named(keys, picked), scores)
            if seeds:
                at = seeds if picked is None else picked[seeds]
                moved = _unit((q + feedback.weight * rows[at].mean(axis=0))[None, :])[0]
                if len(scores) > RESCORED:  # the moved query re-ranks what the query found, not all
                    best = np.argpartition(-scores, RESCORED - 1)[:RESCORED]
                    picked = best if picked is None else picked[best]
                scores = await self._score(rows, moved, picked)
        want = k if admits is None else 2 * k  # (``admits`` is for fingerprints that are most of them)
        while True:
            top = np.argpartition(-scores, want - 1)[:want] if len(scores) > want else np.arange(len(scores))
            top = top[np.argsort(-scores[top], kind="stable")]
            found = top if picked is None else picked[top]
            ranked = list(zip(found.tolist(), scores[top].tolist(), strict=True))
            if admits is not None:
                ranked = [(i, s) for i, s in ranked if admits(keys[i])]
            if len(ranked) >= k or len(top) == len(scores):
                return [(keys[i], s) for i, s in ranked[:k]]
            want *= 2

    def prefetch(self, query: str) -> None:
        """Start embedding ``query`` without waiting for it, so the caller can work meanwhile (memory
        counts the query's words); :meth:`nearest` then takes the vector, made or still in the making."""
        self._embed_query(query[:EMBED_CHARS].strip())

    async def _query(self, query: str) -> NDArray[np.float32] | None:
        if not self._matrix.keys:
            return None
        query = query[:EMBED_CHARS].strip()
        q = self._queries.get(query)
        if q is not None:
            self._queries.move_to_end(query)
            return q
        task = self._embed_query(query)
        if task is None:
            return None
        try:
            async with asyncio.timeout(self._query_wait) as window:
                # Shielded: a stopped turn, or one that stops waiting, does not cancel an embedding
                # another turn may be waiting for (and whose vector is kept when it comes).
                return await asyncio.shield(task)
        except TimeoutError:
            if not window.expired():
                raise
            log.warning("vectors_query_embedding_slow", model=self.model_id, waited=self._query_wait)
            return None

    def _embed_query(self, query: str) -> asyncio.Task[NDArray[np.float32] | None] | None:
        """The task embedding ``query`` (one per text at a time), unless its vector is known."""
        if not query or query in self._queries or not self._matrix.keys:
            return None
        task = self._embedding.get(query)
        if task is None:
            task = self._embedding[query] = asyncio.create_task(self._new_query(query), name="query-vector")
            task.add_done_callback(lambda _: self._embedding.pop(query, None))
        return task

    async def _new_query(self, query: str) -> NDArray[np.float32] | None:
        try:
            q = np.asarray(_unit(await self.embedder.embed([query]))[0], dtype=np.float32)
        except Exception as exc:  # the turn goes on with lexical retrieval only
            if self._failures == 0:
                log.warning("vectors_query_embedding_failed", model=self.model_id, error=str(exc))
            return None
        if q.shape[0] != self._matrix.dim:
            return None
        self._queries[query] = q
        if len(self._queries) > QUERY_CACHE:
            self._queries.popitem(last=False)
        return q

    async def _score(
        self, rows: NDArray[np.float32], q: NDArray[np.float32], picked: NDArray[np.int64] | None
    ) -> NDArray[np.float32]:
        """Cosine of ``q`` with ``rows`` (those at ``picked``, in its order, when given)."""
        if picked is not None and not len(picked):
            return np.zeros(0, dtype=np.float32)

        def score() -> NDArray[np.float32]:
            chosen = rows if picked is None else rows[picked]
            # einsum, not ``@``: OpenBLAS's threaded matrix-vector product is slower here (0.1 against
            # 1.3 ms for 2,000 rows, 11 against 19 ms for 100,000 on 2 cores: its thread hand-offs cost).
            return np.asarray(np.einsum("ij,j->i", chosen, q), dtype=np.float32)

        if (len(rows) if picked is None else len(picked)) > THREAD_SCORING_ROWS:  # ~10 ms of numpy
            return await asyncio.to_thread(score)  # keep it off the event loop
        return score()


class _Named:
    """The keys of scored rows, named only when asked (:meth:`Feedback.pick` asks for a few)."""

    __slots__ = ("_keys", "_picked")

    def __init__(self, keys: list[str], picked: NDArray[np.int64] | None) -> None:
        self._keys = keys
        self._picked = picked

    def __getitem__(self, i: int) -> str:
        return self._keys[i if self._picked is None else int(self._picked[i])]


def _remove(path: Path) -> bool:
    """Delete ``path``; whether it was there."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def _unit(vectors: object) -> NDArray[np.float32]:
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim != 2:
        raise ValueError(f"the embedder answered an array of shape {matrix.shape}, not one row per text")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.asarray(matrix / np.maximum(norms, 1e-12), dtype=np.float32)
