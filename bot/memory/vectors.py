"""VectorStore: one embedding per memory item, computed once in the background, kept on disk, scored by numpy.

Why: re-embedding the whole memory at every start cost 21.7 s for 660 turns, and scoring in Python 1 s per
query at 20,000 items. Here an item is embedded once, when it is written, by one background worker that
batches and never delays a reply; its vector is appended to ``<folder>/<model id>.vec`` (see
``vector_file.py``) and loaded at the next start without recomputation. Vectors are keyed by the item's
fingerprint (a hash of its type and content), so versions of an item that only touch its salience or
last use share one vector, and an edit gets a new one. Each embedding model has its own file: changing
``memory.embeddings_local_model`` starts an empty one, which fills as items are submitted again (at
start-up, or all at once with ``membot memory reindex``).

The store owns the background worker and the query cache's lifetime; the model's file and the rows in
memory (a :class:`~bot.memory.vector_matrix.Matrix`, ``vector_matrix.py``) are kept in step by a
:class:`~bot.memory.vector_table.VectorTable` (``vector_table.py``), and a query is embedded, scored and
ranked, with feedback, by ``vector_search.py``.

Use::

    store = VectorStore(memory_dir / "vectors", embedder)
    await store.start()                      # loads the model's file (100,000 vectors: well under 1 s)
    store.submit(item_store.items())         # queues what has no vector yet; returns at once
    scores = await store.similarities("when is the trip?", [i.fingerprint for i in candidates])
    best = await store.nearest("when is the trip?", k=50)   # [(fingerprint, cosine), ...]
    await store.close()                      # finishes the queue (bounded), stops the worker

``read_only=True`` opens the store for a reader beside the running bot (``membot memory search``): it
loads the model's file as it is and answers queries, and nothing else. No worker, no file removed,
locked, cut, appended to or rewritten (see ``vector_table.py``); :meth:`lacks` counts what the bot
has yet to embed.

A failing embedder (an endpoint down, a missing package) never fails a turn: the failure is logged once,
queries get no semantic scores, and the worker retries the queue later with a growing delay. A slow one
never holds a turn for long either: a query waits for its vector at most ``vector_search.QUERY_WAIT``
seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Iterable
from itertools import islice
from pathlib import Path

import numpy as np
import structlog
from numpy.typing import NDArray

from bot.allocator import release_free_memory
from bot.memory import vector_file, vector_search
from bot.memory.embeddings import EMBED_CHARS, Embedder
from bot.memory.items import MemoryItem
from bot.memory.vector_matrix import unit
from bot.memory.vector_search import QUERY_WAIT, Feedback, QueryVectors
from bot.memory.vector_table import VectorTable
from bot.retry import Backoff

log = structlog.get_logger(__name__)

VECTORS_DIR = "vectors"  # under the memory folder
BATCH = 64  # texts per embedder call
SETTLE = 0.25  # seconds without new items before the queue is embedded
MAX_WAIT = 2.0  # seconds a queued item waits at most while items keep arriving
IDLE_TRIM = 1.0  # seconds without new items after a batch before freed memory goes back to the system

Progress = Callable[[int, int], None]  # (done, total)


class VectorStore:
    """Persistent, background-filled vectors for memory items of one embedding model.

    ``folder`` holds one file per model id (``embedder.model_id``). ``batch`` texts go to the embedder at
    a time; after a failure the worker waits ``retry_after`` seconds, doubling up to ``max_retry_after``.
    A query waits at most ``query_wait`` seconds for its vector (``vector_search.QUERY_WAIT``).
    ``read_only``: see the module doc; its write paths raise.
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
        read_only: bool = False,
    ) -> None:
        self.folder = folder
        self.read_only = read_only
        self.embedder = embedder
        self.model_id = embedder.model_id
        self.path = vector_file.file_for(folder, self.model_id)
        self._batch = batch
        self._retry_after = retry_after
        self._max_retry_after = max_retry_after
        self._settle = settle
        self._max_wait = max_wait
        self._hurry = False  # drain() wants the queue embedded now
        self._queue: dict[str, str] = {}  # fingerprint -> text, oldest first
        self._wake = asyncio.Event()
        self._progress = asyncio.Condition()
        self._worker: asyncio.Task[None] | None = None
        self._failures = 0  # consecutive failed batches; 0 while healthy
        self._failure_events = 0  # every failed batch, ever (drain stops at a new one)
        self.last_error: str | None = None
        self._queries = QueryVectors(
            embedder, matrix=lambda: self._table.matrix, failing=lambda: self._failures > 0, wait=query_wait
        )
        self._table = VectorTable(self.path, self.model_id, self._queries.clear, read_only=read_only)

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load this model's vectors (no embedding happens here) and start the background worker.

        The files of the builds this model replaces (``embedder.replaces``: the same model run another
        way, whose vectors nothing will read again) are removed; their items are embedded anew as they
        are submitted. Read-only: the load alone."""
        if self.read_only:
            await self._table.load()
            return
        for old in getattr(self.embedder, "replaces", ()):
            stale = vector_file.file_for(self.folder, old)
            if await asyncio.to_thread(_remove, stale):
                log.info("vectors_replaced_build_removed", model=self.model_id, removed=stale.name)
        await self._table.load()
        if self._worker is None:
            self._worker = asyncio.create_task(self._work(), name="memory-vectors")

    async def close(self, timeout: float = 10.0) -> None:
        """Embed what is queued (for at most ``timeout`` seconds, and not while failing), then stop.

        Whatever is left is not lost: its items have no vector on disk, so the next start's
        :meth:`submit` of every item queues them again. The same holds for vectors a power cut takes
        before this close's fsync (see vector_file.py).
        """
        if self._worker is None:
            self._queries.cancel()
            return
        if not self._failures:  # while failing, the next retry may be minutes away
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.drain()
        self._worker.cancel()
        self._queries.cancel()
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
        return len(self._table.matrix)

    @property
    def pending(self) -> int:
        """Items queued for embedding (for /status)."""
        return len(self._queue)

    @property
    def query_failure(self) -> str | None:
        """Why the last query got no vector (the embedder failed, or was slow), if it got none."""
        return self._queries.failure

    @property
    def failing(self) -> bool:
        """Whether the embedder's last batch failed (meaning search then waits for its retry)."""
        return self._failures > 0

    def __contains__(self, fingerprint: object) -> bool:
        return fingerprint in self._table.matrix.rows

    def lacks(self, item: MemoryItem) -> bool:
        """Whether ``item`` is live and has content but no vector here (yet)."""
        return not item.deleted and item.fingerprint not in self and bool(item.content.strip())

    def submit(self, items: Iterable[MemoryItem]) -> int:
        """Queue the live items that have no vector yet; return how many were added. Never waits."""
        if self.read_only:
            raise RuntimeError(f"{self.path} was opened read-only: it embeds nothing")
        added = 0
        for item in items:
            key = item.fingerprint
            if key in self._queue or not self.lacks(item):
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
                    await self._table.store([key for key, _ in batch], vectors)
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
        known = {i: q for i, t in enumerate(texts) if (q := self._queries.cached(t.strip())) is not None}
        rest = [t for i, t in enumerate(texts) if i not in known]
        fresh = unit(await self.embedder.embed(rest)) if rest else np.zeros((0, 0), dtype=np.float32)
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

    async def compact(self, live: Collection[str]) -> int:
        """Drop the vectors of fingerprints not in ``live`` once they are at least half the file.

        Returns how many were dropped (0 when it was not worth a rewrite). Run it from maintenance.
        """
        return await self._table.compact(live)

    async def reset(self) -> None:
        """Forget every vector of this model (``membot memory reindex --full``)."""
        await self._table.reset()

    # -- reading ------------------------------------------------------------------------------------

    async def similarities(self, query: str, fingerprints: Iterable[str] | None = None) -> dict[str, float]:
        """Cosine of ``query`` with each fingerprint that has a vector (all of them for ``None``).

        Empty when there are no vectors or the query cannot be embedded (logged once per outage).
        """
        q = await self._queries.vector(query)
        if q is None:
            return {}
        return await vector_search.similarities(self._table.matrix, q, fingerprints)

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
        moved toward its nearest items (see :class:`~bot.memory.vector_search.Feedback`)."""
        q = await self._queries.vector(query)
        if q is None or k <= 0:
            return []
        return await vector_search.nearest(
            self._table.matrix, q, k, fingerprints, feedback=feedback, admits=admits
        )

    def prefetch(self, query: str) -> None:
        """Start embedding ``query`` without waiting for it, so the caller can work meanwhile (memory
        counts the query's words); :meth:`nearest` then takes the vector, made or still in the making."""
        self._queries.prefetch(query)


def _remove(path: Path) -> bool:
    """Delete ``path``; whether it was there."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
