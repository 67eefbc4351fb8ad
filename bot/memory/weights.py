"""How retrieval blends its signals: the ranking weights, one frozen value shared by every ranking step.

retrieval.py blends relevance with recency, salience, confidence and type; word_match.py and anchors.py
weigh what the query's words find (who said it, the period or event the query names, the second hop).
Every one of them reads its figures from the :class:`Weights` it is given; ``bench/memory_recall.py
--weights`` changes them for one run.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    semantic_floor: float = 0.2  # cosine below which meaning counts for nothing (unrelated texts: ~0)
    assistant: float = 0.75  # relevance of what the assistant said, relative to the user's words
    question: float = 0.6  # relevance of a user message that only asked, relative to a statement
    no_fact: float = 0.85  # relevance of a user episode that tells no event or fact (extract.NO_FACT_TAG)
    subject: float = 0.6  # relevance a statement on the subject a query names gets at least (of the top)
    time_hint: float = 0.1  # bonus for items said in the period the query names ("in March")
    # Bonus for items said before/after the event the query names ("before getting the air fryer"):
    # less than a named period's, as the event's time is inferred, and people tell of an earlier event
    # after a later one ("I viewed four houses before the offer", told after telling of the offer).
    event_hint: float = 0.05
    # Matches of the event's words said at other times and scoring at least this share of its best
    # match make its time unclear (no hint). See anchors.py.
    anchor_lead: float = 0.8
    hop: float = 0.3  # weight of the second hop (terms of the first hop's best results), 0: off
    hop_docs: int = 5  # first-hop results the second hop's terms come from
    hop_terms: int = 10  # terms the second hop adds
    conversation: float = 0.0  # relevance an item gains from the conversation it was said in (0..1 share)
    # Sessions as units, in two stages (conversations.py): the score a turn of one of the ``session_top``
    # best conversations gains, ``session_rank`` for the best, times (k + 1) / (k + rank) with
    # ``session_rank_k`` (60: nearly alike for the five); a conversation is ranked by its
    # ``session_turns`` best turns. 0: off. Measured in bench/RESULTS.md, "Memory recall".
    session_rank: float = 0.05
    session_rank_k: int = 60
    session_top: int = 5
    session_turns: int = 3
    # 0: the second hop adds its scores, scaled to the first's; k > 0: reciprocal-rank fusion, 1 / (k +
    # rank) from each hop, the second's times ``hop``. Measured no better (bench/RESULTS.md, "Memory recall").
    hop_fusion_k: int = 0
    candidates: int = 300  # best lexical matches looked at per query, at any memory size
