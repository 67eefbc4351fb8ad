"""Query-time search over the vector store: the query's vector, its cosine with the rows, the nearest.

:class:`~bot.memory.vectors.VectorStore` answers ``similarities`` and ``nearest`` with what is here:
:class:`QueryVectors` makes the query's vector (once per text, waited for at most :data:`QUERY_WAIT`
seconds, kept for the next turns and for the worker, which embeds the same message as an item), then
:func:`similarities` and :func:`nearest` score it against the store's rows (``vector_matrix.Matrix``),
in a worker thread past :data:`THREAD_SCORING_ROWS` rows; :class:`Feedback` moves the query toward its
nearest items and scores again.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import structlog
from numpy.typing import NDArray

from bot.memory.embeddings import EMBED_CHARS, Embedder
from bot.memory.vector_matrix import Matrix, unit

log = structlog.get_logger(__name__)

THREAD_SCORING_ROWS = 20_000  # above this many rows a query is scored in a worker thread
QUERY_CACHE = 256  # recent query vectors kept: a message is the query, then an item to embed
LOOKED_AT = 64  # nearest items among which feedback looks for its seeds
RESCORED = 2_000  # nearest items feedback scores again (a second pass over 100,000 rows costs ~9 ms)
# Seconds a turn waits for its query's vector. The bundled model makes one in milliseconds (its first
# load takes some 0.3 s), an endpoint in well under a second; one that is slow or stuck held the reply
# for as long as it took (for a server sending a byte now and then: until the turn's own timeout).
# Past this the turn goes on with words alone; the vector, if it comes, is kept for the next time.
QUERY_WAIT = 5.0


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


class QueryVectors:
    """The unit vectors of recent queries, each text embedded once (one task per text at a time).

    ``matrix`` returns the store's rows as they are now: with none there is nothing to compare a query
    with, so none is embedded, and a vector of another dimension (the model changed meanwhile) is
    dropped. ``failing`` says whether the store's worker is failing to embed: its outage is logged
    there, once, so a failing query is not logged again. A query waits at most ``wait`` seconds.
    """

    def __init__(
        self,
        embedder: Embedder,
        *,
        matrix: Callable[[], Matrix],
        failing: Callable[[], bool],
        wait: float = QUERY_WAIT,
    ) -> None:
        self._embedder = embedder
        self._model_id = embedder.model_id
        self._matrix = matrix
        self._failing = failing
        self._wait = wait
        self._cache: OrderedDict[str, NDArray[np.float32]] = OrderedDict()
        self._embedding: dict[str, asyncio.Task[NDArray[np.float32] | None]] = {}  # queries in the model
        self.failure: str | None = None  # why the last query got no vector, if it got none

    def cached(self, text: str) -> NDArray[np.float32] | None:
        """The vector of ``text`` if a query made it (the worker takes it instead of embedding again)."""
        return self._cache.get(text)

    def clear(self) -> None:
        """Forget the vectors made (the store's rows were replaced)."""
        self._cache.clear()

    def cancel(self) -> None:
        """Cancel the embeddings in progress (the store is closing)."""
        for task in list(self._embedding.values()):
            task.cancel()

    def prefetch(self, query: str) -> None:
        """Start embedding ``query`` without waiting for it (see ``VectorStore.prefetch``)."""
        self._embed_query(query[:EMBED_CHARS].strip())

    async def vector(self, query: str) -> NDArray[np.float32] | None:
        """The vector of ``query``, or None: no rows to compare it with, it cannot be embedded, or it
        took longer than ``wait`` (it is kept when it comes)."""
        if not self._matrix().keys:
            return None
        query = query[:EMBED_CHARS].strip()
        q = self._cache.get(query)
        if q is not None:
            self._cache.move_to_end(query)
            return q
        task = self._embed_query(query)
        if task is None:
            return None
        try:
            async with asyncio.timeout(self._wait) as window:
                # Shielded: a stopped turn, or one that stops waiting, does not cancel an embedding
                # another turn may be waiting for (and whose vector is kept when it comes).
                return await asyncio.shield(task)
        except TimeoutError:
            if not window.expired():
                raise
            log.warning("vectors_query_embedding_slow", model=self._model_id, waited=self._wait)
            self.failure = f"no vector within {self._wait:g} s"
            return None

    def _embed_query(self, query: str) -> asyncio.Task[NDArray[np.float32] | None] | None:
        """The task embedding ``query`` (one per text at a time), unless its vector is known."""
        if not query or query in self._cache or not self._matrix().keys:
            return None
        task = self._embedding.get(query)
        if task is None:
            task = self._embedding[query] = asyncio.create_task(self._new_query(query), name="query-vector")
            task.add_done_callback(lambda _: self._embedding.pop(query, None))
        return task

    async def _new_query(self, query: str) -> NDArray[np.float32] | None:
        try:
            q = np.asarray(unit(await self._embedder.embed([query]))[0], dtype=np.float32)
        except Exception as exc:  # the turn goes on with lexical retrieval only
            if not self._failing():
                log.warning("vectors_query_embedding_failed", model=self._model_id, error=str(exc))
            self.failure = f"{type(exc).__name__}: {exc}"
            return None
        if q.shape[0] != self._matrix().dim:
            self.failure = f"its vectors have {q.shape[0]} numbers, the stored ones {self._matrix().dim}"
            return None
        self.failure = None
        self._cache[query] = q
        if len(self._cache) > QUERY_CACHE:
            self._cache.popitem(last=False)
        return q


async def similarities(
    matrix: Matrix, q: NDArray[np.float32], fingerprints: Iterable[str] | None = None
) -> dict[str, float]:
    """Cosine of ``q`` with each of ``fingerprints`` that has a row in ``matrix`` (all for ``None``)."""
    keys = matrix.keys  # rows are only ever appended (or overwritten in place): indices hold
    picked = None if fingerprints is None else matrix.pick(fingerprints)
    scores = await _score(matrix.view(), q, picked)
    named = keys[: len(scores)] if picked is None else [keys[i] for i in picked.tolist()]
    return dict(zip(named, scores.tolist(), strict=True))


async def nearest(
    matrix: Matrix,
    q: NDArray[np.float32],
    k: int,
    fingerprints: Iterable[str] | None = None,
    *,
    feedback: Feedback | None = None,
    admits: Callable[[str], bool] | None = None,
) -> list[tuple[str, float]]:
    """The ``k`` keys of ``matrix`` nearest to ``q``, best first, with their cosine (see
    ``VectorStore.nearest``).

    Rows are handled as index arrays and named only for the ``k`` returned: naming every scored
    row (a list of keys per pass, and a dict look-up per key to score again) was most of its time
    on the event loop's thread."""
    keys = matrix.keys  # rows are only ever appended (or overwritten in place): indices hold
    rows = matrix.view()
    picked = None if fingerprints is None else matrix.pick(fingerprints)
    scores = await _score(rows, q, picked)
    if feedback is not None and feedback.seeds > 0:
        seeds = feedback.pick(_Named(keys, picked), scores)
        if seeds:
            at = seeds if picked is None else picked[seeds]
            moved = unit((q + feedback.weight * rows[at].mean(axis=0))[None, :])[0]
            if len(scores) > RESCORED:  # the moved query re-ranks what the query found, not all
                best = np.argpartition(-scores, RESCORED - 1)[:RESCORED]
                picked = best if picked is None else picked[best]
            scores = await _score(rows, moved, picked)
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


async def _score(
    rows: NDArray[np.float32], q: NDArray[np.float32], picked: NDArray[np.int64] | None
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
