"""A segment of the lexical index's delta: recent documents' postings frozen into numpy arrays.

The delta of :class:`~bot.memory.lexical.LexicalIndex` takes writes as dicts; every FOLD_AT documents
they are frozen into a segment, and segments of a size are merged into one, so a query scores a few
arrays instead of looping over thousands of postings in Python. A segment scores in float64, term after
term per document, so its figures are those the dicts gave, to the bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
from numpy.typing import NDArray

K1 = 1.5
B = 0.75

Triples = tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]


@dataclass(slots=True)
class Segment:
    """Documents of the delta, frozen: postings by term in numpy (CSR), like the base's, scored in float64
    term after term exactly as the dicts they came from were (so folding one changes no score)."""

    keys: list[str]
    slot: dict[str, int]
    term_index: dict[str, int]
    offsets: NDArray[np.int64]
    docs: NDArray[np.int64]
    tfs: NDArray[np.float64]
    lengths: NDArray[np.float64]
    alive: NDArray[np.bool_]

    @classmethod
    def of(
        cls,
        keys: list[str],
        terms: list[str],
        postings: Triples,
        lengths: NDArray[np.float64],
    ) -> Segment:
        """From ``(term, doc, tf)`` triples (term: an index into ``terms``, doc: into ``keys``)."""
        term_index, offsets, docs, tfs = by_term(terms, *postings)
        slot = dict(zip(keys, range(len(keys)), strict=True))
        alive = np.ones(len(keys), dtype=np.bool_)
        return cls(keys, slot, term_index, offsets, docs, tfs.astype(np.float64), lengths, alive)

    def postings(self) -> tuple[list[str], NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]:
        """Its live postings as ``(term, doc, tf)`` triples, with the terms they index."""
        term_of = np.repeat(np.arange(len(self.term_index), dtype=np.int64), np.diff(self.offsets))
        keep = self.alive[self.docs]
        return list(self.term_index), term_of[keep], self.docs[keep], self.tfs[keep]

    def copy(self) -> Segment:
        """The same postings with its own live mask (the arrays never change; the mask does)."""
        return Segment(
            self.keys, self.slot, self.term_index, self.offsets, self.docs, self.tfs, self.lengths,
            self.alive.copy(),
        )  # fmt: skip

    def scores(self, weighted: list[tuple[str, float]], average: float) -> NDArray[np.float64] | None:
        """BM25 of each of its documents for the ``(term, idf)`` pairs (dead ones: 0), or ``None`` when
        none of the terms is here. Term by term per document, in float64: the figures of the dicts."""
        spans = [
            (int(self.offsets[at]), int(self.offsets[at + 1]), idf)
            for term, idf in weighted
            if (at := self.term_index.get(term)) is not None
        ]
        if not spans:
            return None
        idf: float | NDArray[np.float64]
        if len(spans) == 1:
            start, end, idf = spans[0]
            docs, tfs = self.docs[start:end], self.tfs[start:end]
        else:
            docs = np.concatenate([self.docs[start:end] for start, end, _ in spans])
            tfs = np.concatenate([self.tfs[start:end] for start, end, _ in spans])
            idf = np.repeat([w for _, _, w in spans], [end - start for start, end, _ in spans])
        norm = tfs + K1 * (1 - B + B * self.lengths[docs] / average)
        # bincount adds in input order, so each document's sum runs over the terms in query order.
        weights = idf * tfs * (K1 + 1) / norm
        found = np.bincount(docs, weights=weights, minlength=len(self.keys)).astype(np.float64, copy=False)
        found[~self.alive] = 0.0
        return found


def by_term(
    terms: list[str], t: NDArray[np.int64], d: NDArray[np.int64], f: NDArray[np.floating]
) -> tuple[dict[str, int], NDArray[np.int64], NDArray[np.int64], NDArray[np.floating]]:
    """``(term, doc, tf)`` triples as postings by term: the terms held (index by term), the offsets of
    each one's postings, and the postings' documents and counts, by term then document."""
    order = np.lexsort((d, t))
    t, d, f = t[order], d[order], f[order]
    counts = np.bincount(t, minlength=len(terms)) if len(t) else np.zeros(len(terms), dtype=np.int64)
    term_index, offsets = held(terms, counts)
    return term_index, offsets, d, f


def held(terms: list[str], counts: NDArray[np.int64]) -> tuple[dict[str, int], NDArray[np.int64]]:
    """The terms some document holds (by their index among them) and their postings' offsets, from each
    term's count of postings: terms no live document holds any more are dropped."""
    used = np.flatnonzero(counts)
    kept = terms if len(used) == len(terms) else [terms[i] for i in used.tolist()]
    term_index = dict(zip(kept, range(len(kept)), strict=True))
    offsets = np.concatenate([[0], np.cumsum(counts[used])]).astype(np.int64)
    return term_index, offsets


def merge(older: Segment, newer: Segment) -> Segment:
    """One segment holding the live documents of both (a key dead in one may live in the other).

    Without sorting: each segment's postings are by term then document, and the older's documents come
    first, so a posting's place is its term's start, plus the older's postings of that term when it is
    the newer's, plus its rank among its own segment's postings of that term."""
    keys: list[str] = []
    remaps = []
    for segment in (older, newer):
        live = np.flatnonzero(segment.alive)
        remap = np.full(len(segment.keys), -1, dtype=np.int64)
        remap[live] = np.arange(len(keys), len(keys) + len(live))
        keys += [segment.keys[i] for i in live.tolist()]
        remaps.append(remap)
    parts = [segment.postings() for segment in (older, newer)]
    union = list(dict.fromkeys(chain(parts[0][0], parts[1][0])))  # (the older's terms first, in order)
    index = dict(zip(union, range(len(union)), strict=True))
    placed: list[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]] = []
    counts = np.zeros(len(union), dtype=np.int64)
    for (terms, t, d, f), remap in zip(parts, remaps, strict=True):
        to_all = np.fromiter(map(index.__getitem__, terms), dtype=np.int64, count=len(terms))
        own = np.bincount(t, minlength=len(terms))
        rank = np.arange(len(t)) - (np.cumsum(own) - own)[t]
        placed.append((to_all[t], rank + counts[to_all[t]], remap[d], f))
        counts[to_all] += own
    term_index, offsets = held(union, counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    docs = np.empty(int(counts.sum()), dtype=np.int64)
    tfs = np.empty(len(docs), dtype=np.float64)
    for term, rank, d, f in placed:
        docs[starts[term] + rank] = d
        tfs[starts[term] + rank] = f
    lengths = np.concatenate([older.lengths[older.alive], newer.lengths[newer.alive]])
    slot = dict(zip(keys, range(len(keys)), strict=True))
    return Segment(keys, slot, term_index, offsets, docs, tfs, lengths, np.ones(len(keys), dtype=np.bool_))
