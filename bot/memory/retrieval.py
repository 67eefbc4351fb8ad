"""Retrieval: rank memory items for a query by BM25 plus recency, salience, confidence and type.

What the query's words find (BM25, the subjects and the period or event it names) comes from
word_match.py. The lexical score is normalized to 0..1 per query and blended with the other signals, so
relevance leads and the rest break ties: a recent, salient preference beats an old chat line that says
the same words.
An optional embedding similarity (see embeddings.py) is fused with the lexical score. The turns of the
conversations most about the query gain a little (conversations.py: sessions ranked as units, then
turns within them).

Who said what matters as much as the words: what the assistant said ranks below what the user said
(the model can be wrong, and the user's words are the facts) unless the query asks about the
assistant's own words ("what did you recommend?"), and a user message that only asked a question
ranks below statements. A query that names a subject ("what is my job?") also finds the statements
tagged with it (see extract.py). Ties are broken by age and content (then id), so the same memory
always gives the same order, whatever order items were loaded in and whatever ids they were given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from itertools import chain
from typing import NamedTuple
from zoneinfo import ZoneInfo

import numpy as np
from numpy.typing import NDArray

from bot.memory.conversations import conversation_of, conversation_scores, session_rank_bonus
from bot.memory.extract import NO_FACT_TAG, QUESTION_TAG
from bot.memory.item_index import retrievable
from bot.memory.item_store import ItemStore
from bot.memory.items import ItemType, MemoryItem, ScoredItem
from bot.memory.timehints import microseconds
from bot.memory.weights import Weights
from bot.memory.word_match import WordMatch, WordMatcher

_UTC = ZoneInfo("UTC")
TRAITS_CACHE = 20_000  # items whose ranking traits are remembered (~250 bytes each; a query ranks hundreds)
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


class Retriever(WordMatcher):
    """Ranks the items of an :class:`ItemStore` for a query (see the module doc): what its words match
    (:class:`WordMatcher`) blended with meaning, recency, salience, confidence and type.

    Build it once per store and ``await ready()`` after the store loaded; its :class:`WordIndex`
    follows every change of the store, and :meth:`save` keeps the index for the next start.
    """

    def __init__(self, store: ItemStore, weights: Weights | None = None) -> None:
        super().__init__(store, weights or Weights())
        self._traits: dict[str, _Traits] = {}

    def rank(
        self,
        query: str,
        now: datetime,
        *,
        visible: Callable[[MemoryItem], bool] | None = None,
        similarities: Mapping[str, float] | None = None,
        tz: ZoneInfo = _UTC,
        matched: WordMatch | None = None,
    ) -> list[ScoredItem]:
        """Every visible item with some relevance to ``query``, best first (ties: older, then by id).

        ``matched`` is :meth:`match_words` of the same query, when the caller worked it out already."""
        w = self.weights
        match = matched or self.match_words(query, now, visible=visible, tz=tz)
        lexical, on_subject, in_period = match.scores, match.on_subject, match.in_period
        top = max(lexical.values(), default=0.0)
        candidates = set(lexical) | on_subject
        top_sim = 0.0
        if similarities:
            similarities = {k: v for k, v in similarities.items() if v >= w.semantic_floor}
            candidates |= set(similarities)
            top_sim = max(similarities.values(), default=0.0)
        get = self._store.get
        found: list[MemoryItem] = []
        for item_id in candidates:
            item = get(item_id)
            if item is not None and retrievable(item) and (visible is None or visible(item)):
                found.append(item)
        if not found:
            return []
        talks = conversation_scores(found, lexical, top) if w.conversation > 0 and top > 0 else {}
        # Each signal as an array over ``found``, combined in the order (and so to the bit) of the
        # per-item formula the doc describes; a Python loop over hundreds of candidates cost more.
        lex = (
            np.array([lexical.get(item.id, 0.0) for item in found]) / top if top > 0 else np.zeros(len(found))
        )
        if talks:  # said in a conversation that is about the query: an answer may not repeat its words
            said_in = np.array([talks.get(conversation_of(item), 0.0) for item in found])
            lex = (1 - w.conversation) * lex + w.conversation * said_in
        if on_subject:  # the statement answers what the query names: relevant without a word
            stated = np.array([item.id in on_subject for item in found])
            lex = np.where(stated, np.maximum(lex, w.subject), lex)
        if similarities:
            # Meaning, on the words' scale: the query's nearest item in meaning is 1.
            sims = np.array([similarities.get(item.id, 0.0) for item in found])
            sim = np.maximum(0.0, sims) / top_sim if top_sim > 0 else np.zeros(len(found))
            relevance = (1 - w.embedding_share) * lex + w.embedding_share * sim
        else:
            sim, relevance = np.zeros(len(found)), lex
        traits = self._traits_of(found)
        stamps = np.array([t.stamp for t in traits], dtype=np.int64)
        # salience, confidence, type weight, and 1.0 for: the assistant's, a question, no fact told
        values = chain.from_iterable(t.values for t in traits)  # (np.array of tuples takes twice as long)
        table = np.fromiter(values, dtype=np.float64, count=6 * len(found)).reshape(len(found), 6)
        if not match.about_assistant:
            relevance = np.where(table[:, 3] > 0, relevance * w.assistant, relevance)
        relevance = np.where(table[:, 4] > 0, relevance * w.question, relevance)
        if not match.asks_advice:  # what the user told of their life answers; asked for advice, all may
            relevance = np.where(table[:, 5] > 0, relevance * w.no_fact, relevance)
        decay = math.log(2) / (w.recency_half_life_days * 86400)  # per second of age
        # Ages in seconds, as timedelta.total_seconds() gives them (whole microseconds / 10**6, rounded
        # once), and exp() from math: the same figures as item by item.
        ages = np.maximum(0.0, (microseconds(now) - stamps) / 1e6)
        exp = math.exp
        recency = [exp(x) for x in (-decay * ages).tolist()]
        score = (
            w.lexical * relevance
            + w.recency * np.array(recency)
            + w.salience * table[:, 0]
            + w.confidence * table[:, 1]
            + w.type * table[:, 2]
        )
        if w.session_rank > 0:
            gains = session_rank_bonus(
                found,
                relevance,
                turns=w.session_turns,
                top=w.session_top,
                k=w.session_rank_k,
                keys=[t.conversation for t in traits],
            )
            score = score + w.session_rank * gains
        for period, bonus in ((in_period, w.time_hint), (match.around_event, w.event_hint)):
            if period is not None:
                said_then = period.among([item.created_at for item in found], stamps)
                score = np.where(said_then, score + bonus, score)
        order = _best_first(score, found)
        keep = (relevance > 0.0).tolist()
        scores, relevances, lexes, sems = score.tolist(), relevance.tolist(), lex.tolist(), sim.tolist()
        return [ScoredItem(found[i], scores[i], relevances[i], lexes[i], sems[i]) for i in order if keep[i]]

    def _traits_of(self, items: Sequence[MemoryItem]) -> list[_Traits]:
        """The ranking traits of ``items``, remembered per item version: the same items come back query
        after query, and reading them afresh (a datetime subtraction each) was a fifth of a ranking."""
        cache, out = self._traits, list[_Traits]()
        for item in items:
            traits = cache.get(item.id)
            if traits is None or traits.item is not item:
                if len(cache) >= TRAITS_CACHE:
                    cache.clear()
                traits = cache[item.id] = _Traits.of(item)
            out.append(traits)
        return out


_FLAG = (0.0, 1.0)  # shared floats: a cached item's flags allocate nothing


class _Traits(NamedTuple):
    """What ranking reads of one version of an item (``item``), besides its words and meaning (a tuple:
    a frozen dataclass took three times as long to make, and a first query makes hundreds)."""

    item: MemoryItem
    stamp: int  # created_at in microseconds since 1970
    values: tuple[float, float, float, float, float, float]  # see Retriever.rank
    conversation: str

    @classmethod
    def of(cls, item: MemoryItem) -> _Traits:
        tags = item.tags
        values = (
            item.salience,
            item.confidence,
            TYPE_WEIGHT.get(item.type, 0.5),
            _FLAG["assistant" in tags],
            _FLAG[QUESTION_TAG in tags],
            _FLAG[NO_FACT_TAG in tags],
        )
        return cls(item, microseconds(item.created_at), values, conversation_of(item))


def _best_first(score: NDArray[np.float64], items: Sequence[MemoryItem]) -> list[int]:
    """Positions by score, best first; equal scores by age, then content, then id (the same memory
    always ranks the same)."""
    order = np.argsort(-score, kind="stable")
    ranked = score[order]
    tied = np.flatnonzero(ranked[1:] == ranked[:-1])
    out: list[int] = order.tolist()
    if len(tied) == 0:
        return out
    # Runs of equal scores (rare: the same words, age and weight) are put in order one by one.
    start = int(tied[0])
    for at, following in zip(tied.tolist(), [*tied[1:].tolist(), -1], strict=True):
        if following != at + 1:
            run = out[start : at + 2]
            run.sort(key=lambda i: (items[i].created_at, items[i].fingerprint, items[i].id))
            out[start : at + 2] = run
            start = following
    return out


def message_key(item: MemoryItem) -> tuple[str, str] | None:
    """The message an item was made from (its first reference), if it came from one."""
    for ref in item.references[:1]:
        return ref.message_key
    return None


def diversify(ranked: Iterable[ScoredItem]) -> Iterable[ScoredItem]:
    """Drop items whose source message already produced a better-ranked item (one hit per message)."""
    seen: set[tuple[str, str]] = set()
    for scored in ranked:
        key = message_key(scored.item)
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        yield scored
