"""Conversations as units of ranking: how much each conversation is about a query, and what its turns gain.

A conversation is the run of messages an item was said in (:func:`conversation_of`). An answer often
shares no word with the question, while the conversation it was said in does: ranking conversations
first and turns within them finds it by where it was said. Two ways, both off by default
(``Weights.conversation`` and ``Weights.session_rank`` in weights.py; bench/RESULTS.md, "Memory recall", has
what each measured):

- a blend (:func:`conversation_scores`): each turn's words mixed with its conversation's words;
- two stages (:func:`session_rank_bonus`): conversations ranked as units by the fused relevance of
  their turns (words and meaning, after who said it), then every turn of the best few gains by its
  conversation's rank, as in reciprocal-rank fusion. Turns keep their own order within a conversation,
  and the turns of the other conversations keep their own score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from bot.memory.items import MemoryItem

READ = 100  # most relevant items the conversations are ranked by


def conversation_of(item: MemoryItem) -> str:
    """The conversation an item was said in: its own id, else the whole session's."""
    ref = item.references[0] if item.references else None
    return (ref.conversation or ref.session_id) if ref is not None else ""


def conversation_scores(
    items: Sequence[MemoryItem], lexical: Mapping[str, float], top: float
) -> dict[str, float]:
    """How much each conversation is about the query, 0..1: its three best matches, the first counting
    most, relative to the best conversation."""
    best: dict[str, list[float]] = {}
    for item in items:
        best.setdefault(conversation_of(item), []).append(lexical.get(item.id, 0.0) / top)
    raw = {
        key: sum(s * w for s, w in zip(sorted(v, reverse=True)[:3], (1.0, 0.5, 0.25), strict=False))
        for key, v in best.items()
    }
    peak = max(raw.values(), default=0.0)
    return {key: value / peak for key, value in raw.items()} if peak > 0 else {}


def rank_conversations(items: Sequence[MemoryItem], relevance: Sequence[float], *, turns: int) -> list[str]:
    """Stage one: the conversations of ``items``, best first, each scored as a unit by its ``turns``
    most relevant messages, the best counting fully and each next one half the one before (1: the best
    turn alone). A message counts once, by its best item (a message and its sentences are one turn).
    Equal scores go by the conversation's key; items said in no conversation are left out."""
    scores = np.asarray(relevance, dtype=np.float64)
    return _ranked(items, [conversation_of(item) for item in items], scores, turns)


def session_rank_bonus(
    items: Sequence[MemoryItem],
    relevance: NDArray[np.float64],
    *,
    turns: int,
    top: int,
    k: int,
    keys: Sequence[str] | None = None,
) -> NDArray[np.float64]:
    """Stage two: what each item gains from its conversation's rank, ``(k + 1) / (k + rank)`` for the
    ``top`` best conversations (1 for the best, ranks from 1) and nothing for the rest. The same for
    every turn of a conversation, so its turns keep their order among themselves. ``keys``: each
    item's :func:`conversation_of`, when the caller has them."""
    keys = [conversation_of(item) for item in items] if keys is None else keys
    ranked = _ranked(items, keys, relevance, turns)[:top]
    gain = {key: (k + 1) / (k + rank) for rank, key in enumerate(ranked, start=1)}
    return np.array([gain.get(key, 0.0) for key in keys])


def _ranked(
    items: Sequence[MemoryItem], keys: Sequence[str], relevance: NDArray[np.float64], turns: int
) -> list[str]:
    """:func:`rank_conversations`, given each item's conversation (``keys``).

    Items are read best first, so a message's first item is its best and a conversation's first
    ``turns`` messages are the ones it is scored by, and only the :data:`READ` best are read: a query's
    candidates are hundreds, and this runs for every query (a conversation none of whose turns is among
    the hundred most relevant is not among the few best)."""
    order = np.argsort(-relevance, kind="stable")[:READ]  # (ties keep their order)
    order = order[relevance[order] > 0.0]
    best: dict[str, dict[object, float]] = {}
    for i, score in zip(order.tolist(), relevance[order].tolist(), strict=True):
        conversation = keys[i]
        if not conversation:
            continue
        said = best.get(conversation)
        if said is None:
            said = best[conversation] = {}
        elif len(said) >= turns:
            continue
        item = items[i]
        ref = item.references[0]
        message = (ref.session_id, ref.message_id) if ref.message_id else item.id
        if message not in said:
            said[message] = score
    shares = [0.5**i for i in range(turns)]
    unit = {
        key: sum(s * share for s, share in zip(said.values(), shares, strict=False))
        for key, said in best.items()
    }
    return sorted(unit, key=lambda key: (-unit[key], key))
