"""Okapi BM25 over an inverted index that is kept up to date item by item.

Memory grows by a few items per answered turn, and a query looks at a few words. So the index is
updated in place when an item is written (cost: its distinct terms), and a query touches only the
postings of its own terms — never every item. That keeps per-turn retrieval flat as memory grows to
100,000 items and many chats, where rebuilding a whole index per write made each turn slower than the
last.

Scores follow Okapi BM25 (k1 = 1.5, b = 0.75) with Lucene's idf, ``log(1 + (N - df + 0.5) / (df +
0.5))``, which stays positive: the classic Okapi idf goes negative for terms in over half the
documents, and in a small memory of a few items that would make every match count against the item.

    index = LexicalIndex()
    index.upsert("item-1", {"tea": 2, "green": 1})
    index.scores(["tea"])          # {"item-1": 0.59...}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

K1 = 1.5
B = 0.75

Frequencies = Mapping[str, int]


class LexicalIndex:
    """Term postings, document lengths and the totals BM25 needs; one entry per key (an item id)."""

    def __init__(self) -> None:
        self._postings: dict[str, dict[str, int]] = {}
        self._docs: dict[str, Frequencies] = {}
        self._lengths: dict[str, int] = {}
        self._total_length = 0

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, key: object) -> bool:
        return key in self._docs

    def upsert(self, key: str, frequencies: Frequencies) -> None:
        """Index ``key`` with these term counts, replacing what it had."""
        self.remove(key)
        self._docs[key] = frequencies
        self._lengths[key] = length = sum(frequencies.values())
        self._total_length += length
        for term, count in frequencies.items():
            self._postings.setdefault(term, {})[key] = count

    def remove(self, key: str) -> None:
        old = self._docs.pop(key, None)
        if old is None:
            return
        self._total_length -= self._lengths.pop(key)
        for term in old:
            posting = self._postings.get(term)
            if posting is not None:
                posting.pop(key, None)
                if not posting:
                    del self._postings[term]

    def terms(self, key: str) -> Frequencies:
        """The term counts ``key`` was indexed with (empty if unknown)."""
        return self._docs.get(key, {})

    def idf(self, term: str) -> float:
        df = len(self._postings.get(term, ()))
        n = len(self._docs)
        return math.log(1 + (n - df + 0.5) / (df + 0.5)) if df else 0.0

    def scores(self, terms: Iterable[str]) -> dict[str, float]:
        """BM25 of every document holding at least one of ``terms`` (each term counted once)."""
        n = len(self._docs)
        if n == 0:
            return {}
        average = self._total_length / n or 1.0
        out: dict[str, float] = {}
        for term in dict.fromkeys(terms):
            posting = self._postings.get(term)
            if not posting:
                continue
            idf = math.log(1 + (n - len(posting) + 0.5) / (len(posting) + 0.5))
            for key, tf in posting.items():
                norm = tf + K1 * (1 - B + B * self._lengths[key] / average)
                out[key] = out.get(key, 0.0) + idf * tf * (K1 + 1) / norm
        return out
