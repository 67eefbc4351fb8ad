"""The lexical index's delta: folded into numpy segments, it scores exactly as plain BM25 over dicts."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pytest

from bot.memory.lexical import FOLD_AT, SEGMENT_MAX, LexicalIndex, Where
from bot.memory.lexical_segment import K1, B
from bot.memory.timehints import microseconds, time_hint

WORDS = [f"w{n}" for n in range(60)]


def bm25(docs: dict[str, dict[str, int]], terms: list[str]) -> dict[str, float]:
    """Okapi BM25 with Lucene's idf, one document and one term at a time, in Python floats."""
    count = len(docs)
    average = sum(sum(d.values()) for d in docs.values()) / count or 1.0
    out: dict[str, float] = {}
    for term in dict.fromkeys(terms):
        df = sum(1 for d in docs.values() if term in d)
        if not df:
            continue
        idf = math.log(1 + (count - df + 0.5) / (df + 0.5))
        for key, d in docs.items():
            if term in d:
                tf = d[term]
                scale = tf + K1 * (1 - B + B * sum(d.values()) / average)
                out[key] = out.get(key, 0.0) + idf * tf * (K1 + 1) / scale
    return out


def writes(index: LexicalIndex, live: dict[str, dict[str, int]], n: int, rnd: random.Random) -> None:
    """``n`` random writes: new documents, new versions of old ones, removals."""
    for _ in range(n):
        roll = rnd.random()
        if roll < 0.15 and live:
            key = rnd.choice(sorted(live))
            index.remove(key)
            del live[key]
            continue
        key = rnd.choice(sorted(live)) if roll < 0.3 and live else f"doc{rnd.randrange(10**9)}"
        doc = {w: rnd.randint(1, 3) for w in rnd.sample(WORDS, rnd.randint(1, 8))}
        index.upsert(key, doc)
        live[key] = doc


def test_delta_segments_score_exactly_like_the_dicts_they_were_folded_from(tmp_path: Path) -> None:
    rnd = random.Random(19)
    index, live = LexicalIndex(), {}
    writes(index, live, 4 * FOLD_AT + 37, rnd)  # several folds, merges of segments, and a tail
    assert index._segments and index._tail and index.delta_size == len(live) == len(index)
    queries = [rnd.sample(WORDS, rnd.randint(1, 6)) for _ in range(30)]
    for terms in queries:
        assert index.scores(terms) == bm25(live, terms)  # to the bit, tail and segments alike
    mine = set(rnd.sample(sorted(live), 40)) | {"not-there"}
    assert index.scores(queries[0], only=mine) == {
        k: v for k, v in bm25(live, queries[0]).items() if k in mine
    }
    # A copy merges in a thread while the index takes writes: neither sees the other's changes.
    copy = index.copy()
    before = copy.scores(queries[1])
    writes(index, dict(live), FOLD_AT, random.Random(5))
    assert copy.scores(queries[1]) == before
    # Merged into the base (float32) and saved: the same documents and, to float32, the same scores.
    merged = copy.merged()
    assert merged.delta_size == 0 and len(merged) == len(live)
    for terms in queries[:5]:
        assert merged.scores(terms) == pytest.approx(bm25(live, terms), rel=1e-5)
    copy.save(tmp_path / "lexical.npz", "", {})
    loaded = LexicalIndex.load(tmp_path / "lexical.npz")
    assert loaded is not None and loaded[0].scores(queries[2]) == pytest.approx(
        bm25(live, queries[2]), rel=1e-5
    )


def test_segments_stay_few_and_removed_documents_leave_them() -> None:
    rnd = random.Random(3)
    index, live = LexicalIndex(), {}
    writes(index, live, 12 * FOLD_AT, rnd)
    sizes = [len(s.keys) for s in index._segments]
    assert 2 <= len(sizes) <= 6 and max(sizes) <= SEGMENT_MAX
    for key in sorted(live)[:50]:
        index.remove(key)
        del live[key]
    terms = WORDS[:10]
    assert index.scores(terms) == bm25(live, terms)
    assert all(index.df(w) == sum(1 for d in live.values() if w in d) for w in WORDS)


def test_the_limit_keeps_the_best_of_base_and_delta_alike_and_ties_by_key() -> None:
    rnd = random.Random(7)
    index, live = LexicalIndex(), {}
    writes(index, live, 3 * FOLD_AT, rnd)
    index = index.merged()  # a base ...
    writes(index, live, 2 * FOLD_AT + 9, rnd)  # ... segments and a tail
    assert len(index) > index.delta_size > FOLD_AT
    for terms in ([WORDS[0]], WORDS[:3], WORDS[5:12]):
        full = index.scores(terms)
        limit = len(full) // 3
        limited = index.scores(terms, limit=limit)
        best = sorted(full.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
        assert limit > 3 and limited == dict(best)  # not all the delta's plus the base's best
    # Equal scores at the limit: the smallest keys, whatever order the documents came in.
    same = [f"doc{n:02}" for n in range(30)]
    ranked = []
    for order in (same, same[::-1]):
        twins = LexicalIndex()
        for key in order:
            twins.upsert(key, {"tea": 1})
        ranked.append(twins.scores(["tea"], limit=5))
    assert ranked[0] == ranked[1] and sorted(ranked[0]) == same[:5]


def test_keys_asked_about_score_as_keys_named_even_when_most_of_the_best_fail() -> None:
    """``Where`` (a chat that holds most items asks about keys instead of naming them): the ``limit`` best
    of the keys that pass, as with the keys named, also when the others fill the best of all."""
    rnd = random.Random(11)
    index, live = LexicalIndex(), {}
    writes(index, live, 10 * FOLD_AT, rnd)
    index = index.merged()  # a base, segments and a tail
    writes(index, live, 2 * FOLD_AT + 5, rnd)
    for terms in ([WORDS[0]], WORDS[:3], WORDS[5:12]):
        full = sorted(index.scores(terms).items(), key=lambda kv: (-kv[1], kv[0]))
        limit = len(full) // 8
        mine = {key for n, (key, _) in enumerate(full) if n >= 3 * limit or n % 4 == 0}  # few of the best
        named = index.scores(terms, limit=limit, only=mine)
        asked = index.scores(terms, limit=limit, only=Where(mine.__contains__))
        assert limit > 3 and len(named) == limit and set(asked) <= mine
        assert sorted(asked.values()) == sorted(named.values())  # (ties at the limit: either key)
        assert index.scores(terms, only=Where(mine.__contains__)) == index.scores(terms, only=mine)


def test_a_time_hint_checks_many_times_as_it_checks_one() -> None:
    tz = ZoneInfo("America/Santiago")
    now = datetime(2024, 4, 8, 15, tzinfo=UTC)
    times = [now - timedelta(hours=h, microseconds=m) for h in range(0, 24 * 120, 7) for m in (0, 1)]
    stamps = np.array([microseconds(t) for t in times], dtype=np.int64)
    for query in ("what did I say last Saturday?", "two weeks ago", "in March", "yesterday", "on March 3rd"):
        hint = time_hint(query, now, tz)
        assert hint is not None
        assert hint.among(times, stamps).tolist() == [hint(t) for t in times]
