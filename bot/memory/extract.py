"""Cheap heuristic extraction: every answered turn becomes episodic items, with typed facts picked out.

This is the baseline that always runs, with no model call: the user's message and the reply are kept
as episode items (long texts split into passages, so retrieval can point at the part that matters), and
sentences that look like preferences, facts, decisions, constraints, tasks, failures or fixes become
typed items that promotion can later move to the durable layers. The consolidation call adds the
model's judgement on top.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from bot.memory.items import ItemType, Layer, MemoryItem, Reference, make_title

PASSAGE_CHARS = 900
MAX_PASSAGES = 12
SENTENCE_CHARS = 400

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_PATTERNS: tuple[tuple[ItemType, float, re.Pattern[str]], ...] = (
    (ItemType.FACT, 0.9, re.compile(r"\b(remember|note) (that|this)\b|\bdon'?t forget\b", re.I)),
    (
        ItemType.PREFERENCE,
        0.75,
        re.compile(
            r"\bI (really |also |usually |don'?t )?(like|love|prefer|enjoy|hate|dislike)\b|\bmy fav", re.I
        ),
    ),
    (
        ItemType.CONSTRAINT,
        0.75,
        re.compile(
            r"\b(please )?(always|never|do not|don'?t ever|must not|make sure to)\b.*\b(you|me|my)\b", re.I
        ),
    ),
    (
        ItemType.DECISION,
        0.7,
        re.compile(
            r"\b(I|we)('ve| have)? (decided|chose|chosen|picked|settled on|went with|will go with)\b", re.I
        ),
    ),
    (
        ItemType.FACT,
        0.7,
        re.compile(
            r"\bmy (name|birthday|wife|husband|partner|son|daughter|kid|dog|cat|job|boss|email|address|phone)"
            r"\b|\bI (am|'m) (a|an) \w+|\bI (live|work|grew up|was born)\b",
            re.I,
        ),
    ),
    (ItemType.TASK_STATE, 0.6, re.compile(r"\b(todo|remind me|I need to|I have to|I'?m working on)\b", re.I)),
    (ItemType.FAILURE, 0.6, re.compile(r"\b(error|exception|traceback|failed|crash(es|ed)?)\b", re.I)),
    (ItemType.FIX, 0.65, re.compile(r"\b(fixed (it|this) by|the fix (is|was)|solved (it|this) by)\b", re.I)),
)


@dataclass(frozen=True, slots=True)
class Utterance:
    """One message to extract from: who said it, what, when, and where it sits."""

    role: str  # "user" | "assistant"
    text: str
    at: datetime
    reference: Reference


def passages(text: str, limit: int = PASSAGE_CHARS) -> list[str]:
    """Split ``text`` at paragraph, then sentence boundaries into pieces of at most ~``limit`` chars."""
    text = text.strip()
    if len(text) <= limit:
        return [text] if text else []
    pieces: list[str] = []
    current = ""
    for sentence in (s for s in _SENTENCE.split(text) if s.strip()):
        while len(sentence) > limit:  # one giant "sentence" (code, a list without stops)
            pieces.append(sentence[:limit])
            sentence = sentence[limit:]
        if current and len(current) + len(sentence) + 1 > limit:
            pieces.append(current)
            current = ""
        current = f"{current} {sentence}".strip()
    if current:
        pieces.append(current)
    return pieces[:MAX_PASSAGES]


def typed_sentences(text: str) -> Iterable[tuple[ItemType, float, str]]:
    """Sentences that match a pattern, with the type and confidence the pattern implies."""
    for sentence in _SENTENCE.split(text):
        sentence = sentence.strip()
        if not 12 <= len(sentence) <= SENTENCE_CHARS:
            continue
        for item_type, confidence, pattern in _PATTERNS:
            if pattern.search(sentence):
                yield item_type, confidence, sentence
                break


def extract(utterances: Iterable[Utterance], *, source: str = "heuristic") -> list[MemoryItem]:
    """Episodic items for a turn's messages: passages of each, plus typed sentences of the user's."""
    items: list[MemoryItem] = []
    for u in utterances:
        salience = 0.5 if u.role == "user" else 0.35
        for piece in passages(u.text):
            items.append(_item(ItemType.EPISODE, piece, u, source, confidence=0.5, salience=salience))
        if u.role != "user":
            continue
        for item_type, confidence, sentence in typed_sentences(u.text):
            items.append(_item(item_type, sentence, u, source, confidence=confidence, salience=0.7))
    return items


def _item(
    item_type: ItemType, content: str, u: Utterance, source: str, *, confidence: float, salience: float
) -> MemoryItem:
    return MemoryItem(
        layer=Layer.EPISODIC,
        type=item_type,
        title=make_title(content),
        content=content,
        tags=(u.role,),
        source=source,
        confidence=confidence,
        salience=salience,
        created_at=u.at,
        updated_at=u.at,
        last_accessed_at=u.at,
        references=(u.reference,),
    )
