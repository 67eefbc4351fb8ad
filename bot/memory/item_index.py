"""ItemIndex: the lookups over the live items that retrieval, recall and notes make every turn.

By UTC day of creation (overall and per chat), by chat, by message, by subject, by fingerprint, and
each conversation's messages in time order. The :class:`~bot.memory.item_store.ItemStore` owns the
items and their logs; it tells its index every change (:meth:`ItemIndex.update`) and rebuilds it at
load (:meth:`ItemIndex.rebuild`), so no lookup ever scans every item or touches the disk.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from datetime import UTC, date, datetime, timedelta
from typing import Any, TypeVar

from bot.memory.items import SENTENCE_TAG, ItemType, MemoryItem, Reference

NEIGHBOUR_SPAN = timedelta(hours=6)  # how far apart the turns of one exchange may be
NEWEST_CHUNK = 64  # entries newest_between copies at a time
SUBJECT_TAG = "subject:"  # tags naming what a statement is about (see extract.py)

K = TypeVar("K")
V = TypeVar("V")
# How _tables files an item: in time order (or appended, or taken out), and in a set (or taken out).
_TimeFiling = Callable[[dict[Any, list[tuple[datetime, str]]], Any, tuple[datetime, str]], None]
_SetFiling = Callable[[dict[Any, set[str]], Any, str], None]
MessageKey = tuple[str, str]  # (session id, message id)
Line = tuple[str, str | None]  # a conversation: (session id, conversation)
# Where a message stands in its conversation, as one item offers it: ((sentence, part, time, item id),
# line). The smallest offer wins (see _place).
_Place = tuple[tuple[bool, int, datetime, str], Line]


def retrievable(item: MemoryItem) -> bool:
    """Live and not represented by another item: a promoted original is its durable copy's, one memory."""
    return not item.deleted and not item.promoted_to


def embeddable(item: MemoryItem) -> bool:
    """Whether an item gets a vector: what the user said and the facts, not the assistant's answers.

    Meaning search is for finding the user's own words worded differently; an answer is still found by
    its words and comes along with the user turn before it (context expansion). Embedding answers cost
    half the model's time (long ones ~10x a user message) and, on the open LongMemEval subset, bought
    nothing: without them evidence reach went 0.977 -> 0.983 and turn recall_all@10 0.831 -> 0.843."""
    return "assistant" not in item.tags


class ItemIndex:
    """What the live items are filed under, for lookups that read only what they return.

    Built from the store's live items, which it reads by id and never changes::

        index = ItemIndex(items)          # the store's dict of live items by id
        index.rebuild(items)              # after a load
        index.update(old, new)            # after every change of one item (None: absent)
        index.neighbours(("tg:1", "m2"))  # the turns around a message
    """

    def __init__(self, items: Mapping[str, MemoryItem]) -> None:
        self._items = items
        self._by_fingerprint: dict[str, set[str]] = {}
        self._by_message: dict[MessageKey, set[str]] = {}
        # A stamp per message, new whenever one of its items changes: what recall built from a message
        # stays valid while the stamp does (stamps only grow, across reloads too).
        self._message_stamps: dict[MessageKey, int] = {}
        self._stamp = 0
        # Each conversation's messages in time order, so a message's neighbours are a bisect away; each
        # message stands at the best place its episodes offer (_place), whatever the order of filing.
        self._timelines: dict[Line, list[tuple[datetime, MessageKey]]] = {}
        self._placed: dict[MessageKey, _Place] = {}
        self._by_subject: dict[str, set[str]] = {}
        self._by_session: dict[str, set[str]] = {}  # what each chat's messages made
        # Items by UTC day of creation, in time order (notes read the newest few of a busy day without
        # sorting it every turn); the same per chat, so a chat's notes (chat scope) read its own items.
        self._by_day: dict[date, list[tuple[datetime, str]]] = {}
        self._by_session_day: dict[tuple[str, date], list[tuple[datetime, str]]] = {}

    # -- keeping it current -----------------------------------------------------------------------

    def rebuild(self, items: Mapping[str, MemoryItem]) -> None:
        """Index ``items`` (the store's live items from now on) from scratch, as after a load: every
        list is appended to, then sorted once."""
        self._items = items
        for sets in (self._by_fingerprint, self._by_subject, self._by_session):
            sets.clear()
        self._by_message.clear()
        self._placed.clear()
        self._timelines.clear()
        self._by_day.clear()
        self._by_session_day.clear()
        placed = self._placed
        for item in items.values():
            firsts = self._tables(item, _append_in_time, _file)  # (sorted once, below)
            if item.type is ItemType.EPISODE:
                for key, ref in firsts.items():
                    place = _place(item, ref)
                    if (best := placed.get(key)) is None or place < best:
                        placed[key] = place
        for key, ((_, _, at, _), line) in placed.items():
            self._timelines.setdefault(line, []).append((at, key))
        for table in (self._timelines, self._by_day, self._by_session_day):
            for entries in table.values():
                entries.sort()
        self._restamp(self._by_message)

    def update(self, old: MemoryItem | None, new: MemoryItem | None) -> None:
        """File one item's change: ``old`` is the version indexed until now (None for a new item),
        ``new`` the one that replaces it (None when it leaves the live set). The store changes its
        items first: this reads the other items of the messages concerned from them.

        Only the entries whose keys differ between the two versions change. A repeat merged into an
        item adds one reference to up to 24 (``REFERENCES_KEPT``); taking every entry out and putting
        it back (the item's place in its day's list and each chat's, a set per message, its
        messages' places) made storing such a merge cost 95 µs, 31 µs now (a busy day of 20,000
        items). The result is the state :meth:`rebuild` would make (tests/bot/memory/test_item_index.py
        checks it)."""
        if old is None or new is None:
            if old is not None:
                self._remove(old)
            if new is not None:
                self._add(new)
            return
        if (
            old.created_at != new.created_at
            or old.type is not new.type
            or (SENTENCE_TAG in old.tags) is not (SENTENCE_TAG in new.tags)
        ):  # filed at another time, or offering other places (none of the bot's own writes does this)
            self._remove(old)
            self._add(new)
            return
        item_id = new.id
        if old.fingerprint != new.fingerprint:
            _unfile(self._by_fingerprint, old.fingerprint, item_id)
            _file(self._by_fingerprint, new.fingerprint, item_id)
        if old.tags != new.tags:
            gone, added = _differ(_subjects(old.tags), _subjects(new.tags))
            self._refile(self._by_subject, item_id, gone, added)
        if old.references == new.references:  # kept as they were (compared by value, item by item)
            self._restamp(_first_references(new))
            return
        old_sessions = {ref.session_id for ref in old.references}
        new_sessions = {ref.session_id for ref in new.references}
        gone, added = _differ(old_sessions, new_sessions)
        self._refile(self._by_session, item_id, gone, added)
        entry, day = (new.created_at, item_id), new.created_at.astimezone(UTC).date()
        for session_id in gone:
            _unfile_in_time(self._by_session_day, (session_id, day), entry)
        for session_id in added:
            _file_in_time(self._by_session_day, (session_id, day), entry)
        old_firsts, new_firsts = _first_references(old), _first_references(new)
        self._refile(
            self._by_message, item_id, old_firsts.keys() - new_firsts, new_firsts.keys() - old_firsts
        )
        if new.type is ItemType.EPISODE:
            for key in old_firsts.keys() | new_firsts.keys():
                ref = new_firsts.get(key)
                if ref is not (before := old_firsts.get(key)) and ref != before:
                    self._offer(key, item_id, None if ref is None else _place(new, ref))
        self._restamp(old_firsts.keys() | new_firsts.keys())

    def _tables(
        self, item: MemoryItem, in_time: _TimeFiling, in_set: _SetFiling
    ) -> dict[MessageKey, Reference]:
        """File (or unfile) ``item`` in every table but the timelines; its messages' first references."""
        item_id, entry = item.id, (item.created_at, item.id)
        in_set(self._by_fingerprint, item.fingerprint, item_id)
        day = item.created_at.astimezone(UTC).date()
        in_time(self._by_day, day, entry)
        for session_id in {ref.session_id for ref in item.references}:
            in_time(self._by_session_day, (session_id, day), entry)
            in_set(self._by_session, session_id, item_id)
        firsts = _first_references(item)
        for key in firsts:
            in_set(self._by_message, key, item_id)
        for subject in _subjects(item.tags):
            in_set(self._by_subject, subject, item_id)
        return firsts

    def _add(self, item: MemoryItem) -> None:
        item_id = item.id
        firsts = self._tables(item, _file_in_time, _file)
        if item.type is ItemType.EPISODE:
            for key, ref in firsts.items():
                if key in self._placed:
                    self._offer(key, item_id, _place(item, ref))
                else:  # mostly: the first item of a new message
                    self._placed[key] = place = _place(item, ref)
                    _file_in_time(self._timelines, place[1], (item.created_at, key))
        self._restamp(firsts)

    def _remove(self, item: MemoryItem) -> None:
        item_id = item.id
        firsts = self._tables(item, _unfile_in_time, _unfile)
        if item.type is ItemType.EPISODE:
            for key in firsts:
                self._offer(key, item_id, None)
        self._restamp(firsts)

    @staticmethod
    def _refile(table: dict[K, set[str]], item_id: str, gone: Iterable[K], added: Iterable[K]) -> None:
        for key in gone:
            _unfile(table, key, item_id)
        for key in added:
            _file(table, key, item_id)

    def _offer(self, key: MessageKey, item_id: str, place: _Place | None) -> None:
        """Item ``item_id`` now offers message ``key`` ``place`` (None: no place); move the message in
        its conversation's timeline if that changes its best place (see :func:`_place`)."""
        current = self._placed.get(key)
        if current is not None and current[0][3] == item_id:  # it held the best: look at every offer
            place = min(self._offers(key), default=None)
        elif current is not None and (place is None or current < place):
            return
        if current == place:
            return
        if current is not None:
            _unfile_in_time(self._timelines, current[1], (current[0][2], key))
        if place is None:
            del self._placed[key]
        else:
            self._placed[key] = place
            _file_in_time(self._timelines, place[1], (place[0][2], key))

    def _offers(self, key: MessageKey) -> Iterator[_Place]:
        """The places the message's live episodes offer it (a few: its passages, a repeat's item)."""
        for item_id in self._by_message.get(key, ()):
            item = self._items.get(item_id)
            if item is not None and item.type is ItemType.EPISODE:
                yield _place(item, _first_references(item)[key])

    def _restamp(self, keys: Iterable[MessageKey]) -> None:
        self._stamp += 1
        stamps, stamp = self._message_stamps, self._stamp
        for key in keys:
            stamps[key] = stamp

    # -- lookups ----------------------------------------------------------------------------------

    def of_message(self, key: MessageKey) -> list[MemoryItem]:
        """The live items made from one message (its passages, typed sentences, promoted copies)."""
        return [self._items[i] for i in self._by_message.get(key, ()) if i in self._items]

    def stamp_of(self, key: MessageKey) -> int:
        """The message's current stamp (see ``_message_stamps``); 0 for one with no items."""
        return self._message_stamps.get(key, 0)

    def passages(self, key: MessageKey) -> list[MemoryItem]:
        """The message's text items in order: together they are the whole message."""
        parts: list[tuple[int, MemoryItem]] = []
        for item in self.of_message(key):
            if item.type is not ItemType.EPISODE or SENTENCE_TAG in item.tags:
                continue
            ref = next((r for r in item.references if r.message_key == key), None)
            parts.append((ref.part or 0 if ref else 0, item))
        parts.sort(key=lambda p: (p[0], p[1].created_at, p[1].id))
        return [item for _, item in parts]

    def created_between(self, start: datetime, end: datetime) -> list[MemoryItem]:
        """Live, retrievable items created in ``[start, end)``, oldest first."""
        return list(reversed(list(self.newest_between(start, end))))

    def newest_between(
        self, start: datetime, end: datetime, *, session_id: str | None = None
    ) -> Iterator[MemoryItem]:
        """Like :meth:`created_between`, newest first and lazily: a caller that needs only the last few
        (today's notes in a busy workspace) sorts one day's items, not all of them."""
        day = (end - timedelta(microseconds=1)).astimezone(UTC).date()
        first = start.astimezone(UTC).date()
        items = self._items
        while day >= first:
            entries = (
                self._by_day.get(day) if session_id is None else self._by_session_day.get((session_id, day))
            )
            stop = bisect.bisect_left(entries, (end,)) if entries else 0
            while entries and stop > 0:
                # A copy of a few entries at a time, found again by the first of them: the caller may
                # write items while it reads on. (A copy of the whole busy day, every turn for the few
                # newest, was most of the time of today's notes.)
                chunk = entries[max(0, stop - NEWEST_CHUNK) : stop]
                for at, item_id in reversed(chunk):
                    if at < start:
                        return
                    item = items.get(item_id)
                    if item is not None and retrievable(item):
                        yield item
                stop = bisect.bisect_left(entries, chunk[0])
            day -= timedelta(days=1)

    def neighbours(self, key: MessageKey, *, within: timedelta = NEIGHBOUR_SPAN) -> list[MessageKey]:
        """The messages said just before and just after message ``key`` in its conversation (at most
        one each, within ``within``): the exchange it belongs to."""
        placed = self._placed.get(key)
        if placed is None:
            return []
        (_, _, at, _), line = placed
        timeline = self._timelines[line]
        i = bisect.bisect_left(timeline, (at, key))
        found = []
        if i > 0 and at - timeline[i - 1][0] <= within:
            found.append(timeline[i - 1][1])
        if i + 1 < len(timeline) and timeline[i + 1][0] - at <= within:
            found.append(timeline[i + 1][1])
        return found

    def with_fingerprint(self, fingerprint: str) -> list[MemoryItem]:
        """The live, retrievable items saying exactly this (one per layer, and per chat with ``per_chat``)."""
        ids = self._by_fingerprint.get(fingerprint)
        if not ids:
            return []
        items = self._items
        return [item for i in ids if retrievable(item := items[i])]

    def with_subject(self, subject: str) -> list[MemoryItem]:
        """Live, retrievable items stating ``subject`` (a ``subject:`` tag), in no particular order: every
        chat's, a list that grows with all that was ever said on it (filter it, never sort it per query)."""
        found = (self._items.get(i) for i in self._by_subject.get(subject, ()))
        return [item for item in found if item is not None and retrievable(item)]

    def of_session(self, session_id: str) -> AbstractSet[str]:
        """Ids of the items a reference ties to chat ``session_id`` (chat scope's own items); read only."""
        return self._by_session.get(session_id, frozenset())


def _first_references(item: MemoryItem) -> dict[MessageKey, Reference]:
    """The item's messages, each with its first reference to it (a message's passages order by it)."""
    # Reversed: of references to one message (passages of it that merged), the first one stays.
    return {(r.session_id, r.message_id): r for r in reversed(item.references) if r.message_id}


def _place(item: MemoryItem, ref: Reference) -> _Place:
    """The place episode ``item`` offers the message of ``ref`` in its conversation: its time.

    A message's place is the best its episodes offer: its first passage's (the item recorded first for
    it, when the message was; a passage that repeated an older one offers that one's time), a
    sentence's only when no passage is left. An order of its own, not "whichever was filed first", so
    that a message whose item went stands where a load would put it.
    """
    rank = (SENTENCE_TAG in item.tags, ref.part or 0, item.created_at, item.id)
    return rank, (ref.session_id, ref.conversation)


def _subjects(tags: tuple[str, ...]) -> set[str]:
    return {tag[len(SUBJECT_TAG) :] for tag in tags if tag.startswith(SUBJECT_TAG)}


def _differ(old: AbstractSet[K], new: AbstractSet[K]) -> tuple[AbstractSet[K], AbstractSet[K]]:
    """What ``old`` has and ``new`` lacks, and the reverse."""
    return old - new, new - old


def _append_in_time(table: dict[K, list[tuple[datetime, V]]], key: K, entry: tuple[datetime, V]) -> None:
    """Add ``entry`` at the end of ``table[key]`` (a rebuild sorts each list once it has them all)."""
    table.setdefault(key, []).append(entry)


def _file(table: dict[K, set[str]], key: K, item_id: str) -> None:
    """Add ``item_id`` under ``key``."""
    ids = table.get(key)
    if ids is None:
        table[key] = {item_id}
    else:
        ids.add(item_id)


def _unfile(table: dict[K, set[str]], key: K, item_id: str) -> None:
    """Take ``item_id`` out from under ``key``, dropping a key left empty."""
    ids = table.get(key)
    if ids is not None:
        ids.discard(item_id)
        if not ids:
            del table[key]


def _file_in_time(table: dict[K, list[tuple[datetime, V]]], key: K, entry: tuple[datetime, V]) -> None:
    """Add ``entry`` to ``table[key]`` in time order (mostly an append: items come in time order)."""
    entries = table.get(key)
    if entries is None:
        table[key] = [entry]
    else:
        bisect.insort(entries, entry)


def _unfile_in_time(table: dict[K, list[tuple[datetime, V]]], key: K, entry: tuple[datetime, V]) -> None:
    """Take ``entry`` out of ``table[key]``, dropping a key left empty."""
    entries = table.get(key)
    if entries is not None:
        at = bisect.bisect_left(entries, entry)
        if at < len(entries) and entries[at] == entry:
            del entries[at]
            if not entries:
                del table[key]
