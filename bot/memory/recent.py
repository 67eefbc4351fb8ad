"""What was said lately, as note lines: the ``## Today's Notes`` and ``## Recent Context`` of a prompt.

The lines are made from the item store (a message's items carry its text and time), not read back from
the daily-note files, so that they skip what the prompt already shows and fit a token budget: the newest
informative messages that fit, "thanks, great!" left out.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

from bot.memory.item_store import ItemStore
from bot.memory.notes import fold
from bot.memory.recall import Candidate, Memory, MessageKey, Recaller, key_of
from bot.memory.retrieval import ScoredItem
from bot.memory.scope import may_see
from bot.memory.words import tokenize

INFORMATIVE_TOKENS = 2  # a note line says something: "thanks a lot!" and "ok, great" stay out
INFORMATIVE_HEAD = 200  # characters of a message that decide that, nearly always
ACKNOWLEDGEMENTS = "thanks thank ok okay great cool sure sound good nice perfect awesome yes lot"
NOTE_USER_CHARS = 300
NOTE_ASSISTANT_CHARS = 200


class RecentNotes:
    """Finds what was said in a period (:meth:`said_between`) and fits it as note lines (:meth:`fit`).

    In chat scope a chat's notes hold only what was said in that chat.
    """

    def __init__(self, items: ItemStore, recaller: Recaller, *, tz: ZoneInfo, chat_scope: bool) -> None:
        self._items = items
        self._recaller = recaller
        self._tz = tz
        self._chat_scope = chat_scope

    def said_between(
        self, start: datetime, end: datetime, session_id: str, skip: set[MessageKey]
    ) -> Iterator[Candidate]:
        """What was said in ``[start, end)`` that the prompt does not show yet, one candidate per
        message, newest first and lazily: notes need the last few, however busy the day was."""
        pending: dict[MessageKey, list[ScoredItem]] = {}
        at: datetime | None = None
        own = session_id if self._chat_scope and session_id else None  # chat scope: only this chat's
        for item in self._items.newest_between(start, end, session_id=own):
            if item.source in ("tool", "consolidation"):
                continue
            if not may_see(session_id, item, chat_scope=self._chat_scope):
                continue
            if at is not None and item.created_at < at:  # every item of a message shares its time
                yield from (Candidate(key, tuple(hits)) for key, hits in pending.items())
                pending.clear()
            at = item.created_at
            key = key_of(item)
            if key not in skip:
                pending.setdefault(key, []).append(ScoredItem(item, 0.0, 0.0))
        yield from (Candidate(key, tuple(hits)) for key, hits in pending.items())

    def fit(self, newest_first: Iterable[Candidate], budget: int) -> list[tuple[Memory, str]]:
        """The newest informative messages (not "thanks!") whose note lines fit ``budget`` tokens,
        oldest first, each with its note line."""
        chosen: list[tuple[Memory, str]] = []
        used = 0
        for candidate in newest_first:
            memory = self._recaller.realize(candidate)
            if not informative(memory.text):
                continue
            line = note_of(memory, self._tz)
            cost = self._recaller.count(line) + 1
            if used + cost > budget:
                break
            chosen.append((memory, line))
            used += cost
        return sorted(chosen, key=lambda chosen: (chosen[0].when, chosen[0].key))


@functools.cache
def _acknowledgements() -> frozenset[str]:
    return frozenset(tokenize(ACKNOWLEDGEMENTS))


def informative(text: str) -> bool:
    """Whether a message says something beyond "thanks, great!" (worth a note line).

    Today's notes ask it of the day's newest messages on every turn: its start decides for nearly any
    message, and that answer is remembered."""
    head = text[:INFORMATIVE_HEAD]
    return _informative(head) or (len(text) > len(head) and _informative(text))


@functools.lru_cache(maxsize=4096)
def _informative(text: str) -> bool:
    return sum(1 for t in tokenize(text) if t not in _acknowledgements()) >= INFORMATIVE_TOKENS


def note_of(memory: Memory, tz: ZoneInfo) -> str:
    """One line of today's notes: the time, who, and the message folded to a line."""
    who = "assistant" if memory.role == "assistant" else ("user (asked)" if memory.question else "user")
    limit = NOTE_ASSISTANT_CHARS if memory.role == "assistant" else NOTE_USER_CHARS
    return f"- [{memory.when.astimezone(tz):%H:%M}] {who}: {fold(memory.text, limit)}"
