"""When an event the query names happened: "before getting the air fryer", "since I started my new job".

A query can place its question before or after an event that is no date (:func:`anchor_of`). Memory
knows when the user told of it: the user's statements that best match its words, said in one talk.
What was said before that talk, or after it, is then a period like any other (the time hint's bonus,
never a filter), and so are those statements themselves: the answer usually needs them. The rest of
the talk is on neither side: a message said a minute before the event's is no more "before the event"
than one said a minute after (a talk often tells of earlier and later things in any order).

A wrong time would lift the wrong half of memory, so the event must be found clearly: the user's
statement that best matches it (not a question, not the assistant's words) holds most of its words (by
weight), and every match nearly as good, whoever said it (weighed as the ranking weighs them), was said
within a day of it: the same talk, not another event with the same words ("since the trip" after two
trips names none).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from bot.memory.extract import NO_FACT_TAG, QUESTION_TAG
from bot.memory.item_index import retrievable
from bot.memory.items import MemoryItem
from bot.memory.lexical import LexicalIndex
from bot.memory.timehints import EPOCH, MICROSECOND, Span, names_time
from bot.memory.weights import Weights
from bot.memory.words import tokenize

COVER = 0.5  # of the event's word weight (idf) its best match must hold
SAME_TELLING = timedelta(days=1)  # how far apart the matches of one event may have been said


@dataclass(frozen=True, slots=True)
class Anchor:
    """ "Before/after/since <event>" where the event is no date ("before getting the air fryer"): the
    event's ``words``, and whether the query means what came ``after`` it (else what came before)."""

    words: str
    after: bool


# The event runs to the end of its clause: "since I recovered from the flu when I went jogging".
_EVENT = re.compile(r"\b(before|prior to|after|since)\s+([^?!.,;:]+)", re.I)
_CLAUSE_END = re.compile(r"\b(?:when|while|whereas|because|but|so that|and then|then|if)\b", re.I)
# Not an event: "before long", "ever since", "after all", "before then", "since then".
_NO_EVENT = re.compile(r"^(?:long|then|that|this|all|it|now|ever|yet|which|too|again)\b", re.I)


def anchor_of(query: str) -> Anchor | None:
    """The event the query places its question before or after, if it names one that is not a time
    ("before the 7/22 trip", "since last week" are :func:`~bot.memory.timehints.periods`)."""
    for m in _EVENT.finditer(query):
        clause = _CLAUSE_END.split(m.group(2), maxsplit=1)[0].strip()
        if clause and not _NO_EVENT.match(clause) and not names_time(clause):
            return Anchor(clause, after=m.group(1).lower() in ("after", "since"))
    return None


def event_spans(
    anchor: Anchor,
    now: datetime,
    *,
    index: LexicalIndex,
    get: Callable[[str], MemoryItem | None],
    terms_of: Callable[[MemoryItem], Mapping[str, int]],
    weights: Weights,
    visible: Callable[[MemoryItem], bool] | None = None,
    only: Container[str] | None = None,
) -> tuple[Span, ...] | None:
    """What was said before the talk that tells of the event (from 1970) or after it (to ``now``), and
    the moments its matching statements were said, or ``None`` when memory does not clearly tell when
    it was."""
    tokens = tokenize(anchor.words)
    if not tokens:
        return None
    weighed: list[tuple[float, MemoryItem]] = []
    for key, score in index.scores(tokens, limit=weights.candidates, only=only).items():
        item = get(key)
        if item is None or not retrievable(item) or item.created_at > now:
            continue
        if visible is None or visible(item):
            weighed.append((score * _said_weight(item, weights), item))
    told_by_user = [pair for pair in weighed if _statement(pair[1])]
    if not told_by_user:
        return None
    top, best = max(
        told_by_user, key=lambda pair: (pair[0], -pair[1].created_at.timestamp(), pair[1].fingerprint)
    )
    asked = set(tokens)
    held = asked & terms_of(best).keys()
    if sum(index.idf(t) for t in held) < COVER * sum(index.idf(t) for t in asked):
        return None
    strong = [item for score, item in weighed if score >= weights.anchor_lead * top]
    talk = [item.created_at for item in strong]
    if max(talk) - min(talk) > SAME_TELLING:
        return None
    side = (max(talk) + MICROSECOND, now) if anchor.after else (EPOCH, min(talk) - MICROSECOND)
    statements = sorted({item.created_at for item in strong if _statement(item)})
    return (side, *((when, when) for when in statements))


def _statement(item: MemoryItem) -> bool:
    """Whether the user told it (a question or the assistant's words tell of no event of theirs)."""
    return "assistant" not in item.tags and QUESTION_TAG not in item.tags


def _said_weight(item: MemoryItem, weights: Weights) -> float:
    """How much an item's words count as the user telling of an event (the ranking's weights)."""
    weight = 1.0
    if "assistant" in item.tags:
        weight *= weights.assistant
    if QUESTION_TAG in item.tags:
        weight *= weights.question
    if NO_FACT_TAG in item.tags:
        weight *= weights.no_fact
    return weight
