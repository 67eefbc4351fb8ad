"""MemoryItem: one typed, referenced piece of structured memory, and the vocabulary around it.

Items are small frozen values. Every change (merge, promotion, decay, access) produces a new version
with the same id; the store keeps the newest version. ``references`` name the session and messages an
item came from and are carried through every step, so any item can be traced back to its transcript.
"""

from __future__ import annotations

import hashlib
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from bot.domain import new_id, parse_time

_Value = TypeVar("_Value")


def _pickled_by_tuple(cls: type[_Value]) -> type[_Value]:
    """Pickle a frozen slotted dataclass as the tuple of its fields, read in one C call.

    The item snapshot (item_snapshot.py) pickles every live item, and a start unpickles them.
    dataclasses' own state methods look the class's fields up again for every object: two thirds of
    the 1.9 s that pickling 100,000 items took. The state holds the same values in the same order as
    theirs (a tuple instead of a list), and either loads.
    """
    names = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    read = operator.attrgetter(*names)
    assign = object.__setattr__  # frozen: as dataclasses' __init__ sets them

    def getstate(self: _Value) -> tuple[object, ...]:
        values: tuple[object, ...] = read(self)
        return values

    def setstate(self: _Value, state: Sequence[object]) -> None:
        for name, value in zip(names, state, strict=True):
            assign(self, name, value)

    setattr(cls, "__getstate__", getstate)  # noqa: B010 (mypy refuses assigning a method)
    setattr(cls, "__setstate__", setstate)  # noqa: B010
    return cls


class Layer(StrEnum):
    EPISODIC = "episodic"  # what happened, per day; decays
    SEMANTIC = "semantic"  # durable facts, preferences, decisions, constraints
    PROCEDURAL = "procedural"  # how to do things: fixes, failures, command results


class ItemType(StrEnum):
    DECISION = "decision"
    CONSTRAINT = "constraint"
    FAILURE = "failure"
    FIX = "fix"
    PREFERENCE = "preference"
    FACT = "fact"
    TASK_STATE = "task_state"
    COMMAND_RESULT = "command_result"
    EPISODE = "episode"  # a plain record of what was said


PROCEDURAL_TYPES = frozenset({ItemType.FAILURE, ItemType.FIX, ItemType.COMMAND_RESULT})
# An episode that repeats one sentence of its message, to be found by it (bot/memory/extract.py): not
# one of the passages that make up the message.
SENTENCE_TAG = "sentence"
# Sources of facts that stand alone (the memory tool's, a consolidation's): recall shows the fact itself,
# not a message it references. A promoted copy of one keeps its source, so it stands alone too.
STANDALONE_SOURCES = frozenset({"tool", "consolidation"})


def promoted_layer(item_type: ItemType) -> Layer | None:
    """Where a confident episodic item of this type goes when promoted (``None``: it stays episodic)."""
    if item_type in (ItemType.EPISODE, ItemType.TASK_STATE):
        return None
    return Layer.PROCEDURAL if item_type in PROCEDURAL_TYPES else Layer.SEMANTIC


@_pickled_by_tuple
@dataclass(frozen=True, slots=True)
class Reference:
    """Where an item came from: a session, one of its messages, (for imports) the turn index, for a
    passage of a long message its position, so the message can be put back together in order, and the
    conversation it was said in (``""``: the session is the conversation, as for imports)."""

    session_id: str
    message_id: str = ""
    turn: int | None = None
    part: int | None = None
    conversation: str = ""

    @property
    def message_key(self) -> tuple[str, str] | None:
        """``(session id, message id)``, the identity of the message; ``None`` for a fact with no message."""
        return (self.session_id, self.message_id) if self.message_id else None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"session_id": self.session_id, "message_id": self.message_id}
        if self.turn is not None:
            data["turn"] = self.turn
        if self.part is not None:
            data["part"] = self.part
        if self.conversation:
            data["conversation"] = self.conversation
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reference:
        turn, part = data.get("turn"), data.get("part")
        return cls(
            str(data["session_id"]),
            str(data.get("message_id") or ""),
            int(turn) if turn is not None else None,
            int(part) if part is not None else None,
            str(data.get("conversation") or ""),
        )


_SPACE = re.compile(r"\s+")
REPEAT_BONUS = 0.1
# An item said again and again ("ok, thanks!") keeps its first references and its newest, not all: each
# repeat rewrites the item, so an unbounded list would make every write cost more than the last.
REFERENCES_KEPT = 24
FIRST_REFERENCES_KEPT = 4


def normalize(text: str) -> str:
    return _SPACE.sub(" ", text).strip().lower()


def fingerprint(item_type: ItemType, content: str, tags: tuple[str, ...] = ()) -> str:
    """Identity of what an item says: same type and same normalized content means the same memory. A
    sentence an item is found by (``SENTENCE_TAG``) is never the same memory as a message of those words:
    merged, the message would lose its text to a sentence of another."""
    kind = f"{item_type.value}:{SENTENCE_TAG}" if SENTENCE_TAG in tags else item_type.value
    return hashlib.sha256(f"{kind}\n{normalize(content)}".encode()).hexdigest()[:24]


@_pickled_by_tuple
@dataclass(frozen=True, slots=True)
class MemoryItem:
    """One memory. Build new ones with keyword arguments; change them with :meth:`with_changes`."""

    layer: Layer
    type: ItemType
    title: str
    content: str
    created_at: datetime
    updated_at: datetime
    last_accessed_at: datetime
    source: str = "heuristic"  # heuristic | consolidation | tool | import | promotion
    tags: tuple[str, ...] = ()
    confidence: float = 0.5
    salience: float = 0.5
    references: tuple[Reference, ...] = ()
    id: str = field(default_factory=new_id)
    fingerprint: str = ""
    promoted_to: str | None = None  # id of the semantic/procedural copy, once promoted
    deleted: bool = False  # a tombstone: the item was forgotten

    def __post_init__(self) -> None:
        if not self.fingerprint:
            object.__setattr__(self, "fingerprint", fingerprint(self.type, self.content, self.tags))

    def with_changes(self, **changes: Any) -> MemoryItem:
        """A new version of this item; the fingerprint follows a change of type, content or tags."""
        updated = replace(self, **changes)
        if "content" in changes or "type" in changes or "tags" in changes:
            updated = replace(updated, fingerprint=fingerprint(updated.type, updated.content, updated.tags))
        return updated

    def merged_with(self, other: MemoryItem, now: datetime) -> MemoryItem:
        """The duplicate ``other`` folded into this item: references joined, the stronger signals kept."""
        new_refs = tuple(r for r in other.references if r not in self.references)
        tags = self.tags + tuple(t for t in other.tags if t not in self.tags)
        # Said again in another message: surer than either saying alone (a repeat promotes).
        confidence = max(self.confidence, other.confidence) + (REPEAT_BONUS if new_refs else 0.0)
        return replace(
            self,
            references=_bounded(self.references + new_refs),
            tags=tags,
            confidence=min(1.0, confidence),
            salience=min(1.0, max(self.salience, other.salience) + 0.05),
            updated_at=max(self.updated_at, now),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "layer": self.layer.value,
            "type": self.type.value,
            "title": self.title,
            "content": self.content,
            "tags": list(self.tags),
            "source": self.source,
            "confidence": round(self.confidence, 4),
            "salience": round(self.salience, 4),
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "last_accessed_at": self.last_accessed_at.isoformat(),
            "references": [r.to_dict() for r in self.references],
            "fingerprint": self.fingerprint,
            "promoted_to": self.promoted_to,
            "deleted": self.deleted,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryItem:
        return cls(
            id=str(data["id"]),
            layer=Layer(data["layer"]),
            type=ItemType(data["type"]),
            title=str(data.get("title") or ""),
            content=str(data.get("content") or ""),
            tags=tuple(str(t) for t in data.get("tags") or ()),
            source=str(data.get("source") or "heuristic"),
            confidence=float(data.get("confidence", 0.5)),
            salience=float(data.get("salience", 0.5)),
            created_at=parse_time(data["created_at"]),
            updated_at=parse_time(data["updated_at"]),
            last_accessed_at=parse_time(data.get("last_accessed_at") or data["updated_at"]),
            references=tuple(Reference.from_dict(r) for r in data.get("references") or ()),
            fingerprint=str(data.get("fingerprint") or ""),
            promoted_to=data.get("promoted_to"),
            deleted=bool(data.get("deleted", False)),
        )


@dataclass(slots=True)  # not frozen: a query makes hundreds, and a frozen one costs 4x to build
class ScoredItem:
    """An item as ranked for a query (retrieval.py); here, beside the item, so that what only carries
    ranked items (recall, the pack) does not load the ranking and numpy."""

    item: MemoryItem
    score: float
    relevance: float  # to the query, 0..1: words and meaning, weighed by who said it and how
    lexical: float = 0.0  # the words alone, 0..1 (the query's best match is 1)
    semantic: float = 0.0


def make_title(content: str, limit: int = 60) -> str:
    flat = _SPACE.sub(" ", content).strip()
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _bounded(references: tuple[Reference, ...]) -> tuple[Reference, ...]:
    if len(references) <= REFERENCES_KEPT:
        return references
    return references[:FIRST_REFERENCES_KEPT] + references[FIRST_REFERENCES_KEPT - REFERENCES_KEPT :]
