"""ItemIndex: the lookups over the live items that retrieval, recall and notes make every turn.

By UTC day of creation (overall and per chat), by chat, by message, by subject, by fingerprint, and
each conversation's messages in time order. The :class:`~bot.memory.item_store.ItemStore` owns the
items and their logs; it tells its index every change (:meth:`ItemIndex.update`) and rebuilds it at
load (:meth:`ItemIndex.rebuild`), so no lookup ever scans every item or touches the disk.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from datetime import UTC, date, datetime, timedelta
from typing import TypeVar

from bot.memory.items import SENTENCE_TAG, ItemType, MemoryItem

NEIGHBOUR_SPAN = timedelta(hours=6)  # how far apart the turns of one exchange may be
NEWEST_CHUNK = 64  # entries newest_between copies at a time
SUBJECT_TAG = "subject:"  # tags naming what a statement is about (see extract.py)

K = TypeVar("K")
V = TypeVar("V")
MessageKey = tuple[str, str]  # (session id, message id)
Line = tuple[str, str | None]  # a conversation: (session id, conversation)


def retrievable(item: MemoryItem) -> bool:
    """Live and not represented by another item: a promoted original is its durable copy's, one memory."""
    return not item.deleted and not item.promoted_to


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
        # Each conversation's messages in time order, so a message's neighbours are a bisect away.
        self._timelines: dict[Line, list[tuple[datetime, MessageKey]]] = {}
        self._placed: dict[MessageKey, tuple[Line, datetime]] = {}
        self._by_subject: dict[str, set[str]] = {}
        self._by_session: dict[str, set[str]] = {}  # what each chat's messages made
        # Items by UTC day of creation, in time order (notes read the newest few of a busy day without
        # sorting it every turn); the same per chat, so a chat's notes (chat scope) read its own items.
        self._by_day: dict[date, list[tuple[datetime, str]]] = {}
        self._by_session_day: dict[tuple[str, date], list[tuple[datetime, str]]] = {}
        self._bulk = False

    # -- keeping it current -----------------------------------------------------------------------

    def rebuild(self, items: Mapping[str, MemoryItem]) -> None:
        """Index ``items`` (the store's live items from now on) from scratch, as after a load."""
        self._items = items
        self._by_fingerprint.clear()
        self._by_message.clear()
        self._by_subject.clear()
        self._by_session.clear()
        self._timelines.clear()
        self._placed.clear()
        self._by_day.clear()
        self._by_session_day.clear()
        self._bulk = True  # timelines are appended to, then sorted once
        for item in items.values():
            self.update(None, item)
        self._bulk = False
        for table in (self._timelines, self._by_day, self._by_session_day):
            for entries in table.values():
                entries.sort()

    def update(self, old: MemoryItem | None, new: MemoryItem | None) -> None:
        """File one item's change: ``old`` is the version indexed until now (None for a new item),
        ``new`` the one that replaces it (None when it leaves the live set)."""
        if old is not None:
            _file(self._by_fingerprint, old.fingerprint, old.id, add=False)
            self._index(old, add=False)
        if new is not None:
            _file(self._by_fingerprint, new.fingerprint, new.id, add=True)
            self._index(new, add=True)

    def _index(self, item: MemoryItem, *, add: bool) -> None:
        day, entry = item.created_at.astimezone(UTC).date(), (item.created_at, item.id)
        self._file_in_time(self._by_day, day, entry, add=add)
        for session_id in {ref.session_id for ref in item.references}:
            self._file_in_time(self._by_session_day, (session_id, day), entry, add=add)
            _file(self._by_session, session_id, item.id, add=add)
        for ref in item.references:
            if ref.message_key is not None:
                _file(self._by_message, ref.message_key, item.id, add=add)
                self._stamp += 1
                self._message_stamps[ref.message_key] = self._stamp
                if add and item.type is ItemType.EPISODE:
                    self._place(ref.message_key, (ref.session_id, ref.conversation), item.created_at)
                elif not add and ref.message_key not in self._by_message:
                    self._unplace(ref.message_key)
        for tag in item.tags:
            if tag.startswith(SUBJECT_TAG):
                _file(self._by_subject, tag[len(SUBJECT_TAG) :], item.id, add=add)

    def _file_in_time(
        self, table: dict[K, list[tuple[datetime, V]]], key: K, entry: tuple[datetime, V], *, add: bool
    ) -> None:
        """Add ``entry`` to ``table[key]`` in time order (mostly an append: items and messages come in
        time order; a bulk load appends and sorts once), or take it out, dropping a key left empty."""
        entries = table.get(key)
        if add:
            if entries is None:
                table[key] = [entry]
            elif self._bulk:
                entries.append(entry)
            else:
                bisect.insort(entries, entry)
            return
        if entries is not None:
            at = bisect.bisect_left(entries, entry)
            if at < len(entries) and entries[at] == entry:
                del entries[at]
                if not entries:
                    del table[key]

    def _place(self, key: MessageKey, line: Line, at: datetime) -> None:
        if key in self._placed:
            return
        self._placed[key] = (line, at)
        self._file_in_time(self._timelines, line, (at, key), add=True)

    def _unplace(self, key: MessageKey) -> None:
        placed = self._placed.pop(key, None)
        if placed is None:
            return
        line, at = placed
        self._file_in_time(self._timelines, line, (at, key), add=False)

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
        line, at = placed
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


def _file(table: dict[K, set[str]], key: K, item_id: str, *, add: bool) -> None:
    """Add ``item_id`` under ``key``, or take it out (dropping a key left empty)."""
    if add:
        ids = table.get(key)
        if ids is None:
            table[key] = {item_id}
        else:
            ids.add(item_id)
        return
    ids = table.get(key)
    if ids is not None:
        ids.discard(item_id)
        if not ids:
            del table[key]
