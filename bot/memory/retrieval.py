"""Retrieval: rank memory items for a query by BM25 plus recency, salience, confidence and type.

The lexical signal is Okapi BM25 (rank-bm25) over lower-cased word tokens without English stop words,
each reduced to its dictionary lemma (simplemma: "bought" -> "buy", "older" -> "old") and then through a
light suffix stripper, so the words a user asks with meet the words they used. Any script tokenizes;
Chinese and Japanese, written without spaces, are indexed as overlapping character pairs. The score is
normalized to 0..1 per query and blended with the other signals, so relevance leads and the rest break
ties: a recent, salient preference beats an old chat line that says the same words.
An optional embedding similarity (see embeddings.py) is fused with the lexical score.

The index is rebuilt lazily when the item store changes (its ``generation`` moves), and token lists
are cached per item version, so a rebuild re-tokenizes only new items.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from zoneinfo import ZoneInfo

import simplemma
from rank_bm25 import BM25Okapi

from bot.memory.items import ItemType, Layer, MemoryItem
from bot.memory.timehints import time_hint

_UTC = ZoneInfo("UTC")
SUBSET_CACHE = 64  # per-chat indexes kept between queries (chat scope)


_TOKEN = re.compile(r"[^\W_]+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have having
    he her here hers herself him himself his how i if in into is it its itself just me more most my myself no
    nor not now of off on once only or other our ours ourselves out over own same she should so some such than
    that the their theirs them themselves then there these they this those through to too under until up very
    was we were what when where which while who whom why will with would you your yours yourself yourselves
    s t d ll m re ve also get got im ive id dont let lets can cant could would many much total""".split()  # noqa: SIM905
)

TYPE_WEIGHT: Mapping[ItemType, float] = {
    ItemType.PREFERENCE: 1.0,
    ItemType.CONSTRAINT: 1.0,
    ItemType.DECISION: 0.9,
    ItemType.FACT: 0.9,
    ItemType.FIX: 0.8,
    ItemType.FAILURE: 0.6,
    ItemType.TASK_STATE: 0.7,
    ItemType.COMMAND_RESULT: 0.5,
    ItemType.EPISODE: 0.4,
}


@dataclass(frozen=True, slots=True)
class Weights:
    """How the signals blend. Lexical relevance dominates; the others order near-ties."""

    lexical: float = 0.75
    recency: float = 0.08
    salience: float = 0.07
    confidence: float = 0.04
    type: float = 0.06
    recency_half_life_days: float = 30.0
    embedding_share: float = 0.5  # of the relevance signal, when embeddings are on
    assistant: float = 0.8  # lexical weight of what the assistant said, relative to the user's words
    time_hint: float = 0.1  # bonus for items said in the period the query names ("in March")


def stem(token: str) -> str:
    """A deliberately light suffix stripper (plurals, -ing, -ed, final e), so "bikes", "bike" and
    "biking" meet. Both queries and items go through it, so only consistency matters, not grammar."""
    if len(token) <= 3 or token.isdigit():
        return token
    if token.endswith("ies"):
        token = token[:-3] + "y"
    elif token.endswith("sses"):
        token = token[:-2]
    elif token.endswith("s") and token[-2] not in "sui":
        token = token[:-1]
    for suffix in ("ing", "ed"):
        if token.endswith(suffix) and len(token) - len(suffix) >= 3:
            token = token[: -len(suffix)]
            if len(token) > 3 and token[-1] == token[-2] and token[-1] not in "lsz":
                token = token[:-1]  # running -> run
            break
    if len(token) > 3 and token.endswith("e"):
        token = token[:-1]
    return token


@lru_cache(maxsize=65536)
def normalize_word(word: str) -> str:
    """The lemma of an English word, then stemmed; words of other languages pass through unchanged."""
    return stem(simplemma.lemmatize(word, lang="en").lower())


def load_lemmas() -> None:
    """Read the English lemma dictionary now (blocking, ~0.1 s): call it off the event loop at start."""
    normalize_word("warming")


def tokenize(text: str) -> list[str]:
    out: list[str] = []
    for token in _TOKEN.findall(text.lower()):
        if _CJK.search(token):
            out.extend(token[i : i + 2] for i in range(max(1, len(token) - 1)))
        elif token not in STOPWORDS:
            out.append(normalize_word(token))
    return out


@dataclass(frozen=True, slots=True)
class ScoredItem:
    item: MemoryItem
    score: float
    lexical: float
    semantic: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)


class _FrequencyBM25(BM25Okapi):  # type: ignore[misc]
    """BM25Okapi fed with per-document term counts computed once per item version (not per rebuild)."""

    def _initialize(self, corpus: list[dict[str, int]]) -> dict[str, int]:
        nd: dict[str, int] = {}
        total = 0
        for frequencies in corpus:
            length = sum(frequencies.values())
            self.doc_len.append(length)
            total += length
            self.doc_freqs.append(frequencies)
            for word in frequencies:
                nd[word] = nd.get(word, 0) + 1
            self.corpus_size += 1
        self.avgdl = total / self.corpus_size
        return nd

    def _calc_idf(self, nd: dict[str, int]) -> None:
        # Lucene's idf, always positive: Okapi's goes negative for terms in over half the documents,
        # which in a small memory (a few items) would make every match count against the item.
        for word, freq in nd.items():
            self.idf[word] = math.log(1 + (self.corpus_size - freq + 0.5) / (freq + 0.5))


Frequencies = dict[str, int]


def frequencies(item: MemoryItem) -> Frequencies:
    counts: Frequencies = {}
    for token in tokenize(f"{item.title} {item.content}"):
        counts[token] = counts.get(token, 0) + 1
    return counts or {"\x00": 1}  # BM25 divides by the average length: never an empty document


class LexicalIndex:
    """BM25 over a fixed list of items; cheap to query, rebuilt when the item set changes."""

    def __init__(self, items: Sequence[MemoryItem], cache: dict[tuple[str, str], Frequencies]) -> None:
        self.items = list(items)
        corpus = []
        for item in self.items:
            key = (item.id, item.fingerprint)
            counts = cache.get(key)
            if counts is None:
                counts = cache[key] = frequencies(item)
            corpus.append(counts)
        self._bm25 = _FrequencyBM25(corpus) if corpus else None

    def scores(self, query_tokens: Sequence[str]) -> list[float]:
        if self._bm25 is None or not query_tokens:
            return [0.0] * len(self.items)
        return [float(x) for x in self._bm25.get_scores(list(dict.fromkeys(query_tokens)))]


class Retriever:
    """Ranks items: build once per item-set generation, query many times."""

    def __init__(self, weights: Weights | None = None) -> None:
        self.weights = weights or Weights()
        self._token_cache: dict[tuple[str, str], Frequencies] = {}
        self._index: LexicalIndex | None = None
        self._generation = -1
        self._subsets: dict[str, tuple[int, LexicalIndex]] = {}

    def prepare(self, items: Iterable[MemoryItem]) -> None:
        """Count terms of new items at write time, so the next index rebuild only sums them up."""
        for item in items:
            key = (item.id, item.fingerprint)
            if key not in self._token_cache:
                self._token_cache[key] = frequencies(item)

    def refresh(self, items: Sequence[MemoryItem], generation: int) -> LexicalIndex:
        if self._index is None or generation != self._generation:
            live = {(i.id, i.fingerprint) for i in items}
            if len(self._token_cache) > 2 * len(live) + 1024:
                self._token_cache = {k: v for k, v in self._token_cache.items() if k in live}
            self._index = LexicalIndex(items, self._token_cache)
            self._generation = generation
        return self._index

    def subset(self, key: str, items: Sequence[MemoryItem], generation: int) -> LexicalIndex:
        """An index over just ``items`` (one chat's, in chat scope), kept per ``key`` for a generation.

        Ranking a subset on its own index, rather than filtering a ranking of everything, keeps the
        scores and the top-k per chat: another chat's items neither crowd out nor reweigh this one's.
        """
        cached = self._subsets.pop(key, None)
        if cached is None or cached[0] != generation:
            cached = (generation, LexicalIndex(items, self._token_cache))
        self._subsets[key] = cached
        while len(self._subsets) > SUBSET_CACHE:  # bounded: least recently used chats go first
            self._subsets.pop(next(iter(self._subsets)))
        return cached[1]

    def rank(
        self,
        index: LexicalIndex,
        query: str,
        now: datetime,
        *,
        similarities: Mapping[str, float] | None = None,
        tz: ZoneInfo = _UTC,
    ) -> list[ScoredItem]:
        """Every item with some relevance to ``query``, best first."""
        w = self.weights
        in_period = time_hint(query, now, tz) if w.time_hint else None
        lexical = index.scores(tokenize(query))
        top = max(lexical, default=0.0)
        out: list[ScoredItem] = []
        for item, raw in zip(index.items, lexical, strict=True):
            lex = raw / top if top > 0 else 0.0
            sim = max(0.0, similarities.get(item.id, 0.0)) if similarities else 0.0
            relevance = (1 - w.embedding_share) * lex + w.embedding_share * sim if similarities else lex
            if "assistant" in item.tags:
                relevance *= w.assistant
            if relevance <= 0.0:
                continue
            age_days = max(0.0, (now - item.created_at).total_seconds() / 86400)
            parts = {
                "lexical": w.lexical * relevance,
                "recency": w.recency * math.exp(-math.log(2) * age_days / w.recency_half_life_days),
                "salience": w.salience * item.salience,
                "confidence": w.confidence * item.confidence,
                "type": w.type * TYPE_WEIGHT.get(item.type, 0.5),
            }
            if in_period is not None and in_period(item.created_at):
                parts["time"] = w.time_hint
            out.append(ScoredItem(item, sum(parts.values()), lex, sim, parts))
        out.sort(key=lambda s: s.score, reverse=True)
        return out


def primary_reference(item: MemoryItem) -> tuple[str, str] | None:
    if not item.references:
        return None
    ref = item.references[0]
    return ref.session_id, ref.message_id or str(ref.turn)


def diversify(ranked: Iterable[ScoredItem]) -> Iterable[ScoredItem]:
    """Drop items whose source message already produced a better-ranked item (one hit per message)."""
    seen: set[tuple[str, str]] = set()
    for scored in ranked:
        key = primary_reference(scored.item)
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        yield scored


def top_per_layer(ranked: Iterable[ScoredItem], limits: Mapping[Layer, int]) -> list[ScoredItem]:
    """Keep the best ``limits[layer]`` items of each layer, in overall rank order."""
    counts: dict[Layer, int] = dict.fromkeys(limits, 0)
    chosen: list[ScoredItem] = []
    for scored in ranked:
        layer = scored.item.layer
        if counts.get(layer, 0) < limits.get(layer, 0):
            counts[layer] += 1
            chosen.append(scored)
    return chosen
