"""Recall: from ranked items to the memories a prompt shows — whole messages and facts, chosen by
relevance within a token budget.

What a ranked message shows, whole or the passages that matched, is put together in memories.py (one
memory per message, scored by its best item). Then, best first:

- a relevance floor (a share of the best match that is not just the question asked again) keeps
  barely relevant filler out;
- messages already in the active session or shown elsewhere in the prompt are skipped;
- the soft budget is filled; one more memory may cross it if the hard budget holds;
- the best few bring the turns around them in their conversation (context expansion: an answer often
  spans a question and its reply), within the hard budget;
- statements on a subject that holds one value (where the user lives, their job) are resolved to the
  newest: it is shown as current and older ones as "previously", and an older one that was recalled
  brings the newest along.

``RecallDiagnostics.stop`` says why it stopped: ``budget``, ``floor`` or ``exhausted``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from bot.memory.items import MemoryItem
from bot.memory.memories import Candidate, Memory, MemoryBuilder, MessageKey, key_of

WHOLE_FIRST = 3  # this many best memories are never shortened
EXPAND_FIRST = 3  # this many best memories bring the turns around them


@dataclass(slots=True)
class RecallDiagnostics:
    candidates: int = 0
    chosen: int = 0
    dropped_for_budget: int = 0
    below_floor: int = 0
    skipped_shown: int = 0  # already in the session or elsewhere in the prompt
    superseded: int = 0
    expanded: int = 0  # turns brought in as the neighbours of the best memories
    tokens: int = 0
    stop: str = "exhausted"


@dataclass(slots=True)
class Recall:
    memories: list[Memory] = field(default_factory=list)
    diagnostics: RecallDiagnostics = field(default_factory=RecallDiagnostics)


class Recaller(MemoryBuilder):
    """Turns a ranking into memories (see the module doc): each put together as a
    :class:`MemoryBuilder`, then chosen within the budgets."""

    def select(
        self,
        candidates: Sequence[Candidate],
        *,
        soft: int,
        hard: int,
        floor: float,
        cost: Callable[[Memory], int],
        brief_assistant: bool = False,
        restates: Callable[[MemoryItem], bool] | None = None,
        diagnostics: RecallDiagnostics | None = None,
        visible: Callable[[MemoryItem], bool] | None = None,
    ) -> Recall:
        """The best memories within the budgets (see the module doc), newest statements on a subject
        standing for the older ones. ``visible`` (chat scope) limits the newer statements brought in
        besides the candidates to what the chat may see."""
        diag = diagnostics or RecallDiagnostics()
        diag.candidates = len(candidates)
        relevance = [c.hits[0].relevance for c in candidates]  # Candidate.relevance, read once
        bar = floor * _top(candidates, relevance, restates)
        chosen: list[Memory] = []
        used = 0
        diag.stop = "exhausted"
        for position, candidate in enumerate(candidates):
            if relevance[position] < bar:  # rank order is not relevance order: look on
                diag.below_floor += 1
                continue
            if used >= soft:
                rest = relevance[position:]
                diag.dropped_for_budget += sum(1 for r in rest if r >= bar)
                diag.below_floor += sum(1 for r in rest if r < bar)
                diag.stop = "budget"
                break
            # The best few are shown whole even when brief: the answer may be in what the assistant said.
            memory = self.realize(candidate, brief_assistant=brief_assistant and len(chosen) >= WHOLE_FIRST)
            price = cost(memory)
            if used + price > hard:
                diag.dropped_for_budget += 1
                continue
            chosen.append(memory)
            used += price
        if diag.stop == "exhausted" and diag.below_floor:
            diag.stop = "floor"
        used += self._expand(chosen, diag, room=max(0, hard - used), cost=cost)
        chosen = self._resolve_subjects(chosen, diag, room=max(0, hard - used), cost=cost, visible=visible)
        diag.chosen = len(chosen)
        return Recall(chosen, diag)

    def _expand(
        self, chosen: list[Memory], diag: RecallDiagnostics, *, room: int, cost: Callable[[Memory], int]
    ) -> int:
        """Context expansion: the best of the user's memories bring the turns around them (the reply that
        answers them, the turn before: an answer often spans two turns), while the hard budget allows.
        Returns the tokens added. (Turns of the same conversation: in chat scope the chat's own.)"""
        have = {m.key for m in chosen}
        added = 0
        for memory in chosen[:EXPAND_FIRST]:
            if memory.role != "user":  # the user's words lead; a reply brings nothing more along
                continue
            for key in self._store.index.neighbours(memory.key):
                if key in have:
                    continue
                near = self.memory_of(key, score=memory.score * 0.5)
                if near is None:
                    continue
                near = replace(near, relevance=memory.relevance * 0.5)
                price = cost(near)
                if added + price > room:
                    continue
                have.add(key)
                chosen.append(near)
                added += price
                diag.expanded += 1
        return added

    def _resolve_subjects(
        self,
        chosen: list[Memory],
        diag: RecallDiagnostics,
        *,
        room: int,
        cost: Callable[[Memory], int],
        visible: Callable[[MemoryItem], bool] | None = None,
    ) -> list[Memory]:
        """Newest statement per subject leads; older ones ride along as "previously" (current facts win).

        An older message rides along only when the newer one speaks to all it was about: "I live in
        Paris and work as a nurse" is not out of date because of "I moved to Berlin". In chat scope
        (``visible``) the newest is the chat's own: another chat's "I moved to Berlin" is someone else's.
        """
        by_key = {m.key: m for m in chosen}
        latest: dict[str, MemoryItem | None] = {}  # per subject: all ever said on it is scanned once
        for memory in list(chosen):
            for subject in memory.subjects:
                if subject not in latest:
                    stated = self._store.index.with_subject(subject)
                    if visible is not None:
                        stated = [item for item in stated if visible(item)]
                    latest[subject] = max(stated, key=lambda i: (i.created_at, i.id), default=None)
                statement = latest[subject]
                if statement is None:
                    continue
                newest = key_of(statement)
                if newest in by_key or statement.created_at <= memory.when:
                    continue
                current = self.memory_of(newest, score=memory.score)
                if current is not None and cost(current) <= room:
                    room -= cost(current)
                    by_key[newest] = current
                    chosen.append(current)
        out: list[Memory] = []
        absorbed: set[MessageKey] = set()
        on_subject = [m for m in chosen if m.subjects]
        for memory in sorted(chosen, key=lambda m: (m.when, m.key), reverse=True):  # newest first
            if memory.key in absorbed:
                continue
            subjects = set(memory.subjects)
            older = [
                m for m in on_subject
                if subjects and m.key != memory.key and m.key not in absorbed and m.when < memory.when
                and subjects.issuperset(m.subjects)
            ]  # fmt: skip
            if older:
                older.sort(key=lambda m: (m.when, m.key), reverse=True)
                absorbed |= {m.key for m in older}
                diag.superseded += len(older)
                memory = replace(
                    memory, previously=tuple(older), score=max(m.score for m in [memory, *older])
                )
            out.append(memory)
        out.sort(key=lambda m: (-m.score, m.when, m.key))
        return out


def _top(
    candidates: Sequence[Candidate], relevance: Sequence[float], restates: Callable[[MemoryItem], bool] | None
) -> float:
    """What the floor is a share of: the best relevance of a memory that says more than the question
    itself. The same question asked before (or repeated back) must not raise the bar and push the
    answer out. Nearly always the most relevant candidate (the first of them, as a stable sort puts
    it); the sort is made only when that one restates the question."""
    if not candidates:
        return 0.0
    best = max(relevance)
    first = candidates[relevance.index(best)]
    if restates is None or not all(restates(h.item) for h in first.hits):
        return best
    top = 0.0
    for candidate in sorted(candidates, key=lambda c: -c.relevance):
        top = top or candidate.relevance
        if not all(restates(h.item) for h in candidate.hits):
            top = candidate.relevance
            break
    return top
