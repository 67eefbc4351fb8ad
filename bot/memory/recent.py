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
from bot.memory.items import STANDALONE_SOURCES, ScoredItem
from bot.memory.memories import Candidate, Memory, MessageKey, key_of
from bot.memory.notes import fold
from bot.memory.recall import Recaller
from bot.memory.scope import belongs_to
from bot.memory.words import tokenize

_Note = tuple[Memory, str, int]  # a message's memory, its note line, the line's tokens and newline
INFORMATIVE_TOKENS = 2  # a note line says something: "thanks a lot!" and "ok, great" stay out
INFORMATIVE_HEAD = 200  # characters of a message that decide that, nearly always
ACKNOWLEDGEMENTS = "thanks thank ok okay great cool sure sound good nice perfect awesome yes lot"
NOTE_USER_CHARS = 300
NOTE_ASSISTANT_CHARS = 200
NOTES_CACHE = 20_000  # messages whose note line is remembered


class RecentNotes:
    """Finds what was said in a period (:meth:`said_between`) and fits it as note lines (:meth:`fit`).

    In chat scope a chat's notes hold only what was said in that chat.
    """

    def __init__(self, items: ItemStore, recaller: Recaller, *, tz: ZoneInfo, chat_scope: bool) -> None:
        self._items = items
        self._recaller = recaller
        self._tz = tz
        self._chat_scope = chat_scope
        # A message's note (its memory, line and tokens; None: not informative) as of its stamp: every
        # turn's notes are mostly the same newest messages, and realizing, folding and pricing them
        # again was most of the notes' time.
        self._notes: dict[MessageKey, tuple[int, _Note | None]] = {}

    def said_between(
        self, start: datetime, end: datetime, session_id: str, skip: set[MessageKey]
    ) -> Iterator[Candidate]:
        """What was said in ``[start, end)`` that the prompt does not show yet, one candidate per
        message, newest first and lazily: notes need the last few, however busy the day was."""
        pending: dict[MessageKey, list[ScoredItem]] = {}
        at: datetime | None = None
        own = session_id if self._chat_scope and session_id else None  # chat scope: only this chat's
        # may_see(), hoisted: this chat's items are read from its own index, and without a chat (chat
        # scope's "") each item is asked.
        ask = self._chat_scope and own is None
        for item in self._items.index.newest_between(start, end, session_id=own):
            if item.source in STANDALONE_SOURCES:
                continue
            if ask and not belongs_to(item, session_id):
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
            note = self._note(candidate)
            if note is None:
                continue
            memory, line, cost = note
            if used + cost > budget:
                break
            chosen.append((memory, line))
            used += cost
        return sorted(chosen, key=lambda chosen: (chosen[0].when, chosen[0].key))

    def _note(self, candidate: Candidate) -> _Note | None:
        """The candidate's memory, note line and its tokens (line and newline), or None when it says
        nothing worth a line; remembered while the message's stamp holds and it is shown whole (then its
        line depends on nothing but its items)."""
        key = candidate.key
        stamp = self._items.index.stamp_of(key) if key[0] != "item" else 0
        if stamp:
            found = self._notes.get(key)
            if found is not None and found[0] == stamp:
                return found[1]
        memory = self._recaller.realize(candidate)
        note = None
        if informative(memory.text):
            line = note_of(memory, self._tz)
            note = (memory, line, self._recaller.count(line) + 1)
        if stamp and memory.whole:
            if len(self._notes) >= NOTES_CACHE:
                self._notes.clear()
            self._notes[key] = (stamp, note)
        return note


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
