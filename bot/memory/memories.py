"""Memories: what recall shows of a message, whole or the passages that matched, and the candidates.

Items are retrieval keys: a message is stored as passages, typed sentences and maybe a promoted copy,
and all of them point back to it. What the model needs is the message itself, once. So the ranked items
are grouped by the message they came from (a fact written by the memory tool or by consolidation stands
alone), a message is scored by its best item, and it is shown whole when it is not too long, or else
the passages that matched. recall.py chooses among them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from bot.memory.extract import QUESTION_TAG, SUBJECT_PREFIX
from bot.memory.item_index import retrievable
from bot.memory.item_store import ItemStore
from bot.memory.items import STANDALONE_SOURCES, Layer, MemoryItem, ScoredItem

TokenCounter = Callable[[str], int]
MessageKey = tuple[str, str]
GAP = "\n[…]\n"
COUNT_CACHE = 20_000  # texts whose token count is remembered
BUILT_CACHE = 20_000  # messages whose shown text is remembered


@dataclass(slots=True)  # not frozen: built by the hundred per turn, 4x cheaper
class Candidate:
    """A message (or standalone fact) some ranked items point at, before its text is put together."""

    key: MessageKey
    hits: tuple[ScoredItem, ...]

    @property
    def score(self) -> float:
        return self.hits[0].score

    @property
    def relevance(self) -> float:
        return self.hits[0].relevance


@dataclass(slots=True)
class Memory:
    """One thing recall shows: a message (whole, or the passages that matched) or a standalone fact."""

    key: MessageKey  # (session id, message id), or ("item", id) for a fact with no single message
    text: str
    role: str  # "user" | "assistant" | "fact"
    when: datetime
    score: float
    relevance: float
    hits: tuple[ScoredItem, ...]
    durable: bool = False  # a fact or a how-to (semantic/procedural layer), not only something said
    question: bool = False  # the user only asked
    whole: bool = True  # False: only the passages that matched a long message
    subjects: tuple[str, ...] = ()
    previously: tuple[Memory, ...] = ()  # older statements on the same subject, newest first
    # In a group's pack: the other chat (session id) it was said in, by whoever writes there; shown with
    # it, so that a private chat's "I work as a nurse" does not read as the asking member's.
    elsewhere: str = ""


@dataclass(slots=True)
class _Built:
    """What a message shows, as of its stamp (see ``MemoryBuilder._built``)."""

    stamp: int
    fallback: str
    text: str
    whole: bool
    when: datetime
    durable: bool
    question: bool
    subjects: tuple[str, ...]


def key_of(item: MemoryItem) -> MessageKey:
    """The message an item stands for, or the item itself when it is a standalone fact."""
    refs = item.references
    if refs and refs[0].message_id and item.source not in STANDALONE_SOURCES:
        return (refs[0].session_id, refs[0].message_id)  # Reference.message_key, inlined: a hot path
    return ("item", item.id)


class MemoryBuilder:
    """Puts together what a ranked message shows (see the module doc); :class:`~bot.memory.recall.Recaller`
    extends it with the choice. ``max_message_tokens`` is the longest message shown whole; a longer one
    shows the passages that matched (and the ones around them, if they fit)."""

    def __init__(self, store: ItemStore, count: TokenCounter, *, max_message_tokens: int = 900) -> None:
        self._store = store
        self._count = count
        self._counts: dict[str, int] = {}
        self._max_message = max_message_tokens
        # What a whole message shows, by (message, length limit), with the message's stamp when built:
        # the same messages come back turn after turn, and putting them together was most of recall's
        # time. Kept while the stamp holds (an item of the message changed: built again).
        self._built: dict[tuple[MessageKey, int], _Built] = {}

    def gather(
        self, ranked: Iterable[ScoredItem], *, skip: set[MessageKey] | None = None
    ) -> tuple[list[Candidate], int]:
        """Candidates in rank order (one per message), and how many messages were skipped as shown.

        Cheap: a candidate's text is put together only when :meth:`~bot.memory.recall.Recaller.select`
        gets to it.
        """
        # One candidate per message, made at its first (best) hit: most messages have one hit, and a
        # list per message copied into a tuple doubled what a turn allocates here (hundreds of them).
        groups: dict[MessageKey, Candidate] = {}
        skipped: set[MessageKey] = set()
        for scored in ranked:
            key = key_of(scored.item)
            if skip and key in skip:
                skipped.add(key)
                continue
            found = groups.get(key)
            if found is None:
                groups[key] = Candidate(key, (scored,))
            else:
                found.hits += (scored,)
        return list(groups.values()), len(skipped)

    def realize(self, candidate: Candidate, *, brief_assistant: bool = False) -> Memory:
        """The candidate's memory. ``brief_assistant``: an answer of the assistant's shows at most a third
        of ``max_message_tokens`` (the parts that matched): it costs less, and the user's own words are
        what most questions are about."""
        return self._memory(candidate.key, candidate.hits, brief_assistant=brief_assistant)

    def count(self, text: str) -> int:
        """Tokens of ``text``, remembered: the same messages are priced turn after turn."""
        found = self._counts.get(text)
        if found is None:
            if len(self._counts) >= COUNT_CACHE:
                self._counts.clear()
            found = self._counts[text] = self._count(text)
        return found

    def memory_of(self, key: MessageKey, score: float = 0.0) -> Memory | None:
        """The memory for a message or item nobody ranked (the newest statement on a subject)."""
        if key[0] == "item":
            item = self._store.get(key[1])
            if item is None or not retrievable(item):
                return None
            return self._memory(key, (ScoredItem(item, score, 0.0),))
        items = [i for i in self._store.index.of_message(key) if retrievable(i)]
        if not items:
            return None
        return self._memory(key, (ScoredItem(items[0], score, 0.0),))

    def _memory(
        self, key: MessageKey, hits: tuple[ScoredItem, ...], *, brief_assistant: bool = False
    ) -> Memory:
        best = hits[0]
        item = best.item
        if key[0] == "item":
            return Memory(
                key, item.content.strip(), "fact", item.created_at, best.score, best.relevance, hits,
                durable=item.layer is not Layer.EPISODIC, subjects=_subjects([item]),
            )  # fmt: skip
        role = "assistant" if "assistant" in item.tags else "user"
        limit = self._max_message // 3 if brief_assistant and role == "assistant" else self._max_message
        stamp = self._store.index.stamp_of(key)
        built = self._built.get((key, limit))
        if built is None or built.stamp != stamp or built.fallback != item.content:
            family = self._store.index.of_message(key)
            parts = self._store.index.passages(key)
            text, whole = self._text(parts, hits, fallback=item.content, limit=limit)
            built = _Built(
                stamp, item.content, text, whole,
                when=min((p.created_at for p in parts), default=item.created_at),
                durable=any(i.layer is not Layer.EPISODIC for i in family if retrievable(i)),
                question=any(QUESTION_TAG in p.tags for p in parts[:1]),
                subjects=_subjects(family),
            )  # fmt: skip
            if whole:  # a cut one depends on which passages matched this query
                if len(self._built) >= BUILT_CACHE:
                    self._built.clear()
                self._built[(key, limit)] = built
        return Memory(
            key, built.text, role, built.when, best.score, best.relevance, hits,
            durable=built.durable, question=built.question, whole=built.whole, subjects=built.subjects,
        )  # fmt: skip

    def _text(
        self, parts: Sequence[MemoryItem], hits: Sequence[ScoredItem], *, fallback: str, limit: int
    ) -> tuple[str, bool]:
        if not parts:
            return fallback.strip(), True
        whole = "\n".join(p.content.strip() for p in parts)
        if len(parts) == 1 or self.count(whole) <= limit:
            return whole, True
        # A long message: its best-matching passages while they fit ``limit`` (the best one always),
        # then the passages around them, nearest first, while they fit.
        position = {p.id: i for i, p in enumerate(parts)}
        best: dict[int, float] = {}
        for hit in hits:
            at = position.get(hit.item.id)
            if at is None:  # a sentence of the message (typed, or one it is found by): its passage
                at = next((i for i, p in enumerate(parts) if hit.item.content.strip() in p.content), None)
            if at is not None:
                best[at] = max(best.get(at, 0.0), hit.score)
        index: list[int] = []
        budget = limit
        for i in sorted(best, key=lambda i: (-best[i], i)) or [0]:
            cost = self.count(parts[i].content)
            if index and cost > budget:
                continue
            index.append(i)
            budget -= cost
        chosen = set(index)
        for step in range(1, len(parts)):
            for i in index:
                for j in (i - step, i + step):
                    if 0 <= j < len(parts) and j not in chosen:
                        cost = self.count(parts[j].content)
                        if cost <= budget:
                            chosen.add(j)
                            budget -= cost
            if budget <= 0:
                break
        pieces: list[str] = []
        last = -1
        for i in sorted(chosen):
            if pieces and i != last + 1:
                pieces.append(GAP.strip())
            pieces.append(parts[i].content.strip())
            last = i
        if 0 not in chosen:
            pieces.insert(0, GAP.strip())
        if len(parts) - 1 not in chosen:
            pieces.append(GAP.strip())
        return "\n".join(pieces), False


def _subjects(items: Iterable[MemoryItem]) -> tuple[str, ...]:
    found = {t[len(SUBJECT_PREFIX) :] for i in items for t in i.tags if t.startswith(SUBJECT_PREFIX)}
    return tuple(sorted(found))
