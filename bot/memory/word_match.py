"""Word matching: what a query's words find in memory, the side of ranking that needs no embedding.

The lexical signal is Okapi BM25 (bot/memory/lexical.py, kept current item by item) over lower-cased
word tokens without English stop words,
each reduced to its dictionary lemma (simplemma: "bought" -> "buy", "older" -> "old") and then through a
light suffix stripper, so the words a user asks with meet the words they used. Any script tokenizes;
Chinese and Japanese, written without spaces, are indexed as overlapping character pairs. A second hop
adds the BM25 of the terms that mark the first hop's best results. A query that names a subject ("what
is my job?") also finds the statements tagged with it (see extract.py), and the period or the event it
names ("in March", "before getting the air fryer") becomes a time hint (timehints.py, anchors.py).
retrieval.py blends what is found here with the other signals.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from zoneinfo import ZoneInfo

from bot.memory.anchors import anchor_of, event_spans
from bot.memory.asks import asks_about_assistant, asks_for_advice
from bot.memory.extract import QUESTION_TAG, owned_subject, subjects_in_query
from bot.memory.item_store import ItemStore
from bot.memory.items import MemoryItem
from bot.memory.lexical import Frequencies
from bot.memory.timehints import TimeHint, time_hint
from bot.memory.weights import Weights
from bot.memory.word_index import WordIndex, frequencies
from bot.memory.words import tokenize

_UTC = ZoneInfo("UTC")
TERMS_CACHE = 4096  # items whose term counts a query may look inside (second hop, restated questions)


@dataclass(frozen=True, slots=True)
class WordMatch:
    """The word side of a query's ranking (:meth:`WordMatcher.match_words`): it needs no embedding, so it
    is worked out while the query's embedding is being made."""

    scores: dict[str, float]  # BM25 by item id, second hop included
    on_subject: set[str]  # items stating the subject the query names
    in_period: TimeHint | None  # the period the query names, if any
    around_event: TimeHint | None  # before or after the event the query names, if memory tells when
    about_assistant: bool
    asks_advice: bool = False  # "can you suggest …": what the user asked for says what they want


class WordMatcher:
    """Finds what a query's words match among the items of an :class:`ItemStore` (see the module doc).

    The ranking :class:`~bot.memory.retrieval.Retriever` is one. Build it once per store and ``await
    ready()`` after the store loaded; its :class:`WordIndex` follows every change of the store, and
    :meth:`save` keeps the index for the next start.
    """

    def __init__(self, store: ItemStore, weights: Weights) -> None:
        self.weights = weights
        self._store = store
        self.words = WordIndex(store)
        self._terms: OrderedDict[tuple[str, str], Frequencies] = OrderedDict()

    async def ready(self) -> None:
        await self.words.ready()

    def restates(self, item: MemoryItem, query: str) -> bool:
        """Whether ``item`` is a question (or the assistant's words) in little more than the query's own
        words: the question asked before, or repeated back."""
        if QUESTION_TAG not in item.tags and "assistant" not in item.tags:
            return False
        return _restates(set(tokenize(query)), self._terms_of(item))

    async def save(self) -> None:
        await self.words.save()

    def _terms_of(self, item: MemoryItem) -> Frequencies:
        """An item's term counts (remembered for the few items a query looks inside)."""
        key = (item.id, item.fingerprint)
        found = self._terms.get(key)
        if found is None:
            found = self._terms[key] = frequencies(item)
            if len(self._terms) > TERMS_CACHE:
                self._terms.popitem(last=False)
        return found

    def match_words(
        self,
        query: str,
        now: datetime,
        *,
        visible: Callable[[MemoryItem], bool] | None = None,
        tz: ZoneInfo = _UTC,
        only: Container[str] | None = None,
        askers: Mapping[str, str] | None = None,
    ) -> WordMatch:
        """What the query's words find: BM25 (and its second hop), the subjects and the period it names.

        ``only`` limits the word match to those item ids (a chat's own, in chat scope), so that the
        ``candidates`` best are the best of them rather than of everyone's. ``askers`` (in a group:
        each sender of the turn's messages, by id, with what they wrote) also finds each one's own
        statements on the subjects their own words ask about: in a group a subject is its speaker's, and
        a turn may answer several members at once (collect mode)."""
        w = self.weights
        tokens = tokenize(query)
        lexical = self.words.index.scores(tokens, limit=w.candidates, only=only)
        if w.hop > 0 and lexical:
            lexical = self._with_second_hop(tokens, lexical, visible, only)
        asked = subjects_in_query(query)
        for asker, said in (askers or {}).items():
            asked += [owned_subject(subject, asker) for subject in subjects_in_query(said)]
        on_subject = {
            stated.id
            for subject in asked
            for stated in self._store.index.with_subject(subject)
            if only is None or stated.id in only
        }
        in_period = time_hint(query, now, tz) if w.time_hint else None
        around_event = self._around_event(query, now, tz, visible, only) if w.event_hint else None
        return WordMatch(
            lexical,
            on_subject,
            in_period,
            around_event,
            asks_about_assistant(query),
            asks_for_advice(query),
        )

    def _around_event(
        self,
        query: str,
        now: datetime,
        tz: ZoneInfo,
        visible: Callable[[MemoryItem], bool] | None,
        only: Container[str] | None,
    ) -> TimeHint | None:
        """Before or after the event the query names, found in memory (anchors.py)."""
        anchor = anchor_of(query)
        if anchor is None:
            return None
        spans = event_spans(
            anchor,
            now,
            index=self.words.index,
            get=self._store.get,
            terms_of=self._terms_of,
            weights=self.weights,
            visible=visible,
            only=only,
        )
        return TimeHint(spans, frozenset(), tz) if spans is not None else None

    def _with_second_hop(
        self,
        tokens: Sequence[str],
        first: dict[str, float],
        visible: Callable[[MemoryItem], bool] | None,
        only: Container[str] | None,
    ) -> dict[str, float]:
        """The first hop's scores plus a second hop's: BM25 of the terms that mark the first hop's best
        results (the names, places and things they share), so an answer worded differently from the
        question is still found through what surrounds it."""
        w, index, asked = self.weights, self.words.index, set(tokens)
        # The best ``hop_docs`` by score. Ties go by age and content, not by id: ids are random, and the
        # same conversation remembered twice must hop the same way. Only the matches scoring at least
        # the ``hop_docs``-th shown one can be among them, so the rest are never looked up.
        store, shown = self._store, list[MemoryItem]()
        for key, score in sorted(first.items(), key=itemgetter(1), reverse=True):  # (stable: ties keep order)
            if len(shown) >= w.hop_docs and (not shown or score < first[shown[-1].id]):
                break
            item = store.get(key)
            if item is not None and (visible is None or visible(item)):
                shown.append(item)
        best = heapq.nsmallest(
            w.hop_docs, shown, key=lambda it: (-first[it.id], it.created_at, it.fingerprint)
        )
        weight: dict[str, float] = {}
        for item in best:
            counts = self._terms_of(item)
            length = sum(counts.values()) or 1
            for term, tf in counts.items():
                if term not in asked and not term.isdigit():
                    weight[term] = weight.get(term, 0.0) + tf / length * index.idf(term)
        terms = sorted(weight, key=lambda t: (-weight[t], t))[: w.hop_terms]
        second = index.scores(terms, limit=w.candidates, only=only) if terms else {}
        top1, top2 = max(first.values()), max(second.values(), default=0.0)
        if top2 <= 0:
            return first
        if w.hop_fusion_k > 0:
            return reciprocal_rank_fusion(first, second, k=w.hop_fusion_k, weight=w.hop)
        # Fused on the first hop's scale: a second-hop match adds up to ``hop`` of the best first-hop one
        # (a first-hop match the second hop missed keeps its score: it adds nothing).
        fused, scale = dict(first), w.hop * top1
        for key, score in second.items():
            fused[key] = fused.get(key, 0.0) + scale * score / top2
        return fused


def reciprocal_rank_fusion(
    first: Mapping[str, float], second: Mapping[str, float], *, k: int, weight: float
) -> dict[str, float]:
    """Each key's ``1 / (k + rank)`` in ``first`` plus ``weight / (k + rank)`` in ``second`` (ranks from
    1, best first; a key missing from a list gets nothing from it). Scores only order the lists, so
    hops whose scores differ in scale fuse alike."""
    fused: dict[str, float] = {}
    for scores, share in ((first, 1.0), (second, weight)):
        ranked = sorted(scores.items(), key=itemgetter(1), reverse=True)  # (stable: ties keep order)
        for rank, (key, _) in enumerate(ranked, start=1):
            fused[key] = fused.get(key, 0.0) + share / (k + rank)
    return fused


def _restates(asked: set[str], terms: Mapping[str, int]) -> bool:
    """Whether an item's words are mostly the query's own: it holds (nearly) all of them and not much else."""
    if not asked or not terms:
        return False
    return len(asked & terms.keys()) >= 0.8 * len(asked) and len(terms) <= 2 * len(asked)
