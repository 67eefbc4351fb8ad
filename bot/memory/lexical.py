"""Okapi BM25 over a frozen base of numpy postings plus a small in-memory delta, saved and loaded whole.

Memory grows by a few items per answered turn and a query looks at a few words, so:

- the **base** holds the postings of everything indexed when it was last built, term by term, in flat
  numpy arrays (CSR): a query term is a slice, scored for all its documents in one vectorized step, and
  loading 100,000 items' index from disk is reading a few arrays, not re-tokenizing them;
- the **delta** holds what was written since: the newest as plain dicts (cost per write: the item's own
  terms), frozen every FOLD_AT documents into small numpy segments (bot/memory/lexical_segment.py)
  that a query scores in a few array steps, with the same figures the dicts gave;
- a removed or changed item is masked in the base; :meth:`merged` folds the delta into a new base
  (in a thread, when the delta has grown) and :meth:`save` writes the base next to the items
  (bot/memory/lexical_file.py).

A query scores only the documents holding its terms, and hands back the ``limit`` best of them all,
base and delta alike, so the per-item work after it stays bounded at any size, however much of the memory
is merged yet.

Scores follow Okapi BM25 (k1 = 1.5, b = 0.75) with Lucene's idf, ``log(1 + (N - df + 0.5) / (df +
0.5))``, which stays positive: the classic Okapi idf goes negative for terms in over half the
documents, and in a small memory of a few items that would make every match count against the item.
Document frequencies of the base count its masked documents until the next merge (a small, temporary
over-count that only touches idf).

    index = LexicalIndex()
    index.upsert("item-1", {"tea": 2, "green": 1})
    index.scores(["tea"])          # {"item-1": 0.59...}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Container, Iterable, Mapping
from itertools import chain
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from bot.memory import lexical_file
from bot.memory.lexical_file import SavedIndex
from bot.memory.lexical_segment import K1, B, Segment, by_term, held, merge

FOLD_AT = 64  # delta documents kept as dicts before they are frozen into a segment
SEGMENT_MAX = 4096  # documents past which two segments are no longer merged into one (the base takes them)

Frequencies = Mapping[str, int]


def _best(scores: dict[str, float], limit: int) -> dict[str, float]:
    """The ``limit`` best of ``scores``; of equal scores at the limit, the smallest keys (the same
    scores give the same candidates, whatever order the documents were indexed in)."""
    if limit <= 0:
        return {}
    keys = list(scores)
    values = np.fromiter(scores.values(), dtype=np.float64, count=len(keys))
    threshold = np.partition(values, len(values) - limit)[len(values) - limit]  # the limit-th best
    above = np.flatnonzero(values > threshold).tolist()
    tied = sorted(keys[i] for i in np.flatnonzero(values == threshold).tolist())
    return {key: scores[key] for key in chain((keys[i] for i in above), tied[: limit - len(above)])}


class Where:
    """The keys that pass ``test``: an ``only`` told by a question rather than a list, for when the keys
    are most of the index (a chat that holds most of the items): naming them would cost a pass over
    most of it per query, asking costs a look at the few best."""

    __slots__ = ("test",)

    def __init__(self, test: Callable[[str], bool]) -> None:
        self.test = test

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.test(key)


class LexicalIndex:
    """Term postings, document lengths and the totals BM25 needs; one entry per key (an item id)."""

    def __init__(self) -> None:
        # Base (frozen, numpy): documents 0..n-1, terms by index, postings by term.
        self._keys: list[str] = []
        self._slot: dict[str, int] = {}
        self._term_index: dict[str, int] = {}
        self._offsets: NDArray[np.int64] = np.zeros(1, dtype=np.int64)
        self._post_docs: NDArray[np.int32] = np.zeros(0, dtype=np.int32)
        self._post_tfs: NDArray[np.float32] = np.zeros(0, dtype=np.float32)
        self._lengths: NDArray[np.float32] = np.zeros(0, dtype=np.float32)
        self._alive: NDArray[np.bool_] = np.zeros(0, dtype=np.bool_)
        # Delta: what was written since the base was built; the newest as dicts (the tail), the rest
        # frozen into segments of FOLD_AT documents (merged pairwise up to SEGMENT_MAX).
        self._segments: list[Segment] = []
        self._tail: dict[str, Frequencies] = {}
        self._postings: dict[str, dict[str, int]] = {}  # the tail's, by term
        self._docs: dict[str, Frequencies] = {}  # every live delta document, in the order written
        self._delta_lengths: dict[str, int] = {}
        self._delta_df: dict[str, int] = {}  # live delta documents holding each term
        # Live totals over both.
        self._count = 0
        self._total_length = 0.0

    # -- size ---------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def __contains__(self, key: object) -> bool:
        if key in self._docs:
            return True
        slot = self._slot.get(key) if isinstance(key, str) else None
        return slot is not None and bool(self._alive[slot])

    @property
    def delta_size(self) -> int:
        return len(self._docs)

    # -- writing ------------------------------------------------------------------------------------

    def upsert(self, key: str, frequencies: Frequencies) -> None:
        """Index ``key`` with these term counts, replacing what it had."""
        self.remove(key)
        self._docs[key] = self._tail[key] = frequencies
        self._delta_lengths[key] = length = sum(frequencies.values())
        self._count += 1
        self._total_length += length
        df = self._delta_df
        for term, count in frequencies.items():
            self._postings.setdefault(term, {})[key] = count
            df[term] = df.get(term, 0) + 1
        if len(self._tail) >= FOLD_AT:
            self._fold()

    def remove(self, key: str) -> None:
        old = self._docs.pop(key, None)
        if old is not None:
            self._count -= 1
            self._total_length -= self._delta_lengths.pop(key)
            df = self._delta_df
            for term in old:
                if df[term] == 1:
                    del df[term]
                else:
                    df[term] -= 1
            if self._tail.pop(key, None) is None:
                for segment in self._segments:
                    at = segment.slot.get(key)
                    if at is not None and segment.alive[at]:
                        segment.alive[at] = False
                        break
                return
            for term in old:
                posting = self._postings.get(term)
                if posting is not None:
                    posting.pop(key, None)
                    if not posting:
                        del self._postings[term]
            return
        slot = self._slot.get(key)
        if slot is not None and self._alive[slot]:
            self._alive[slot] = False
            self._count -= 1
            self._total_length -= float(self._lengths[slot])

    def _fold(self) -> None:
        """Freeze the tail into a segment; merge the newest segments while they are of a size (a binary
        counter: each document is merged a few times, and a query looks at a few segments)."""
        keys = list(self._tail)
        slot = dict(zip(keys, range(len(keys)), strict=True))
        postings = list(self._postings.values())
        sizes = [len(posting) for posting in postings]
        total = sum(sizes)
        triples = (
            np.repeat(np.arange(len(postings), dtype=np.int64), sizes),
            np.fromiter(map(slot.__getitem__, chain.from_iterable(postings)), dtype=np.int64, count=total),
            np.fromiter(chain.from_iterable(p.values() for p in postings), dtype=np.float64, count=total),
        )
        lengths = np.fromiter(map(self._delta_lengths.__getitem__, keys), dtype=np.float64, count=len(keys))
        terms = list(self._postings)
        self._segments.append(Segment.of(keys, terms, triples, lengths))
        self._tail, self._postings = {}, {}
        segments = self._segments
        while len(segments) > 1 and len(segments[-2].keys) <= len(segments[-1].keys):
            if len(segments[-2].keys) + len(segments[-1].keys) > SEGMENT_MAX:
                break
            last = segments.pop()
            segments[-1] = merge(segments[-1], last)

    # -- reading ------------------------------------------------------------------------------------

    def df(self, term: str) -> int:
        at = self._term_index.get(term)
        base = int(self._offsets[at + 1] - self._offsets[at]) if at is not None else 0
        return base + self._delta_df.get(term, 0)

    def idf(self, term: str) -> float:
        df = min(self.df(term), self._count)  # masked base documents may still be counted
        return math.log(1 + (self._count - df + 0.5) / (df + 0.5)) if df else 0.0

    def scores(
        self, terms: Iterable[str], *, limit: int | None = None, only: Container[str] | None = None
    ) -> dict[str, float]:
        """BM25 of the documents holding at least one of ``terms`` (each term counted once); with
        ``limit``, only the ``limit`` best (equal scores at the limit: the smallest keys, but among
        the base's own, those numpy's partition picks: sorting thousands of ties cost ms); with
        ``only`` (a collection of keys, or a :class:`Where`), among those keys alone (one chat's items
        among everyone's: others' cannot crowd them out of the ``limit``)."""
        if self._count == 0:
            return {}
        if isinstance(only, Where):
            return self._scores_where(list(terms), limit, only)
        assert only is None or isinstance(only, Collection)
        average = self._total_length / self._count or 1.0
        out: dict[str, float] = {}
        base: NDArray[np.float32] | None = None
        weighted: list[tuple[str, float]] = []
        for term in dict.fromkeys(terms):
            idf = self.idf(term)
            if idf <= 0:
                continue
            weighted.append((term, idf))
            at = self._term_index.get(term)
            if at is not None:
                start, end = int(self._offsets[at]), int(self._offsets[at + 1])
                docs, tfs = self._post_docs[start:end], self._post_tfs[start:end]
                norm = tfs + K1 * (1 - B + B * self._lengths[docs] / average)
                if base is None:
                    base = np.zeros(len(self._keys), dtype=np.float32)
                base[docs] += (idf * (K1 + 1)) * tfs / norm
            for key, tf in self._postings.get(term, {}).items():
                if only is not None and key not in only:
                    continue
                scale = tf + K1 * (1 - B + B * self._delta_lengths[key] / average)
                out[key] = out.get(key, 0.0) + idf * tf * (K1 + 1) / scale
        for segment in self._segments if weighted else ():
            found = segment.scores(weighted, average)
            if found is None:
                continue
            hit = np.flatnonzero(found)
            keys = segment.keys
            for slot, score in zip(hit.tolist(), found[hit].tolist(), strict=True):
                key = keys[slot]
                if only is None or key in only:
                    out[key] = score
        if base is not None:
            base[~(self._alive if only is None else self._alive & self._mask(only))] = 0.0
            hit = np.flatnonzero(base)
            if limit is not None and len(hit) > limit:  # the rest cannot be among the best
                hit = hit[np.argpartition(-base[hit], limit - 1)[:limit]]
            keys = self._keys
            for slot, score in zip(hit.tolist(), base[hit].tolist(), strict=True):
                out[keys[slot]] = score
        return _best(out, limit) if limit is not None and len(out) > limit else out

    def _scores_where(self, terms: list[str], limit: int | None, only: Where) -> dict[str, float]:
        """:meth:`scores` among the keys ``only`` admits: the best of all, asked about, twice as many each
        time until ``limit`` of them pass (or all matches were looked at). Exact: a key that passes
        and is not among the best looked at cannot score above the ones that passed. It starts at twice
        ``limit``: ``only`` is for keys that are most of the index."""
        want = None if limit is None else 2 * limit
        while True:
            found = self.scores(terms, limit=want)
            kept = {key: score for key, score in found.items() if key in only}
            if want is None or limit is None or len(found) < want or len(kept) >= limit:
                return _best(kept, limit) if limit is not None and len(kept) > limit else kept
            want *= 2

    def _mask(self, keys: Collection[str]) -> NDArray[np.bool_]:
        """The base documents among ``keys``."""
        mask = np.zeros(len(self._keys), dtype=np.bool_)
        slot = self._slot
        mask[[at for key in keys if (at := slot.get(key)) is not None]] = True
        return mask

    # -- merging, saving, loading -------------------------------------------------------------------

    def merged(self) -> LexicalIndex:
        """A new index whose base holds every live document (base and delta), with an empty delta.

        Pure numpy and dict reads: run it in a thread on a :meth:`copy`, then swap it in."""
        live = np.flatnonzero(self._alive)
        keys = [self._keys[i] for i in live.tolist()] + list(self._docs)
        remap = np.full(len(self._keys), -1, dtype=np.int64)
        remap[live] = np.arange(len(live))
        # Base postings as (term, doc, tf) triples, live documents only, renumbered.
        term_of = np.repeat(np.arange(len(self._term_index), dtype=np.int64), np.diff(self._offsets))
        keep = self._alive[self._post_docs] if len(self._post_docs) else np.zeros(0, dtype=np.bool_)
        all_terms = dict(self._term_index)
        ts, ds, fs = (
            [term_of[keep]],
            [remap[self._post_docs[keep]]],
            [self._post_tfs[keep].astype(np.float64)],
        )
        first_delta = len(live)
        delta_slot = {key: first_delta + i for i, key in enumerate(self._docs)}
        for segment in self._segments:
            terms, t, d, f = segment.postings()
            to_all = np.asarray(
                [all_terms.setdefault(term, len(all_terms)) for term in terms], dtype=np.int64
            )
            to_slot = np.asarray([delta_slot.get(key, -1) for key in segment.keys], dtype=np.int64)
            ts.append(to_all[t] if len(t) else t)
            ds.append(to_slot[d] if len(d) else d)
            fs.append(f)
        d_t, d_d, d_f = [], [], []
        for term, posting in self._postings.items():
            index = all_terms.setdefault(term, len(all_terms))
            for key, tf in posting.items():
                d_t.append(index)
                d_d.append(delta_slot[key])
                d_f.append(tf)
        t = np.concatenate([*ts, np.asarray(d_t, dtype=np.int64)])
        d = np.concatenate([*ds, np.asarray(d_d, dtype=np.int64)])
        f = np.concatenate([*fs, np.asarray(d_f, dtype=np.float64)])
        lengths = np.concatenate(
            [self._lengths[live], np.asarray([self._delta_lengths[k] for k in self._docs], dtype=np.float32)]
        )
        term_index, offsets, docs, tfs = by_term(list(all_terms), t, d, f)
        return LexicalIndex._from_arrays(keys, term_index, offsets, docs, tfs, lengths)

    def copy(self) -> LexicalIndex:
        """A copy a thread can merge while this one keeps taking writes."""
        other = LexicalIndex()
        other._keys, other._slot, other._term_index = self._keys, self._slot, self._term_index
        other._offsets, other._post_docs, other._post_tfs = self._offsets, self._post_docs, self._post_tfs
        other._lengths, other._alive = self._lengths, self._alive.copy()
        other._segments = [segment.copy() for segment in self._segments]
        other._tail = dict(self._tail)
        other._postings = {t: dict(p) for t, p in self._postings.items()}
        other._docs, other._delta_lengths = dict(self._docs), dict(self._delta_lengths)
        other._delta_df = dict(self._delta_df)
        other._count, other._total_length = self._count, self._total_length
        return other

    @classmethod
    def _from_arrays(
        cls,
        keys: list[str],
        term_index: dict[str, int],
        offsets: NDArray[np.int64],
        docs: NDArray[np.integer],
        tfs: NDArray[np.floating],
        lengths: NDArray[np.float32],
    ) -> LexicalIndex:
        """An index whose base holds these postings, by term (see :func:`by_term`)."""
        index = cls()
        index._term_index, index._offsets = term_index, offsets
        index._keys = keys
        index._slot = {key: i for i, key in enumerate(keys)}
        index._post_docs = docs.astype(np.int32)
        index._post_tfs = tfs.astype(np.float32)
        index._lengths = lengths.astype(np.float32)
        index._alive = np.ones(len(keys), dtype=np.bool_)
        index._count = len(keys)
        index._total_length = float(lengths.sum())
        return index

    def save(self, path: Path, signature: str, versions: Mapping[str, str]) -> None:
        """Write the index (merged) atomically; blocking. ``signature`` and each key's ``versions`` (what
        the document was made from) come back from :meth:`load`, to tell which documents are stale."""
        full = self.merged() if self._docs or not self._alive.all() else self
        keys, terms = full._keys, list(full._term_index)
        arrays = (full._offsets, full._post_docs, full._post_tfs, full._lengths)
        saved = SavedIndex(signature, keys, terms, [versions.get(k, "") for k in keys], *arrays)
        lexical_file.write(path, saved)

    @classmethod
    def load(cls, path: Path) -> tuple[LexicalIndex, str, dict[str, str]] | None:
        """The index saved at ``path``, its signature and each key's version; ``None`` if missing or
        unreadable (then it is built again from the items)."""
        saved = lexical_file.read(path)
        if saved is None:
            return None
        keys = saved.keys
        term_index, offsets = held(saved.terms, np.diff(saved.offsets))
        index = cls._from_arrays(keys, term_index, offsets, saved.docs, saved.tfs, saved.lengths)
        return index, saved.signature, dict(zip(keys, saved.versions, strict=True))
