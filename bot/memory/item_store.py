"""ItemStore: MemoryItems in JSON-lines files per layer, with dedup, promotion and decay.

Layout under ``items/``: ``episodic/YYYY-MM-DD.jsonl`` (by creation day), ``semantic.jsonl``,
``procedural.jsonl``. Files are append-only logs of item versions: the last line for an id wins and a
``deleted`` version is a tombstone. An item that repeats a live one of its layer merges into it; with
``per_chat`` (memory.scope = "chat") only within one chat, since a merged item belongs to every chat its
references name and shows the message of its first. All live items are kept in memory, so retrieval
never touches the disk; ``compact`` rewrites a log atomically when it holds mostly old versions, or a
damaged line the load set aside (a record a kill cut short: it would stay in the middle of the log).

Every change is made in memory at once (no await between deciding and recording it, so concurrent
chats never act on a stale view: an item is promoted once) and then written by a :class:`GroupWriter`,
which commits the lines of all chats waiting at that moment with one fsync per file.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import json
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TypeGuard, TypeVar

import structlog

from bot import damaged
from bot.domain import new_id
from bot.group_writer import GroupWriter
from bot.heap import collector_paused
from bot.memory import item_snapshot
from bot.memory.items import SENTENCE_TAG, ItemType, Layer, MemoryItem, promoted_layer
from bot.storage import atomic_write_text, ensure_private_dir

log = structlog.get_logger(__name__)

FREEZE_AT = 10_000  # items whose load is frozen from the collector afterwards (bot/heap.py)

DECAY_FACTOR = 0.5
MIN_SALIENCE = 0.05
NEIGHBOUR_SPAN = timedelta(hours=6)  # how far apart the turns of one exchange may be
# Last use is kept to the hour: decay counts in days, and a new version per recall per turn cost more
# than the recall itself.
TOUCH_RESOLUTION = timedelta(hours=1)
NEWEST_CHUNK = 64  # entries newest_between copies at a time
# Items maintenance changes at a time before the chats' turns get the loop back (a few ms each step).
MAINTENANCE_STEP = 100
SUBJECT_TAG = "subject:"  # tags naming what a statement is about (see extract.py)
_LAYERS = tuple(Layer)  # iterating the enum class itself is slow on the retrieval path

K = TypeVar("K")
V = TypeVar("V")
ChangeListener = Callable[[MemoryItem | None, MemoryItem | None], None]
"""Told ``(old, new)`` for every change of the live set: ``old`` None for a new item, ``new`` None for a
removed one (forgotten, or hidden behind its promoted copy). ``(None, None)`` means "reload everything"."""


def retrievable(item: MemoryItem) -> bool:
    """Live and not represented by another item: a promoted original is its durable copy's, one memory."""
    return not item.deleted and not item.promoted_to


class ItemStore:
    """The live set of items plus its on-disk logs (see the module doc)."""

    def __init__(self, root: Path, *, per_chat: bool = False) -> None:
        self._root = root
        self._per_chat = per_chat
        self._items: dict[str, MemoryItem] = {}
        self._by_fingerprint: dict[str, set[str]] = defaultdict(set)
        self._merges: dict[tuple[Layer, str, str], str] = {}  # what a repeat merges into (_merge_key)
        self._lines: dict[Path, int] = defaultdict(int)
        self._damaged: set[Path] = set()  # logs holding lines the load could not read (kept aside)
        self._touched: set[str] = set()  # ids whose last use is newer in memory than on disk
        self._by_message: dict[tuple[str, str], set[str]] = defaultdict(set)
        # A stamp per message, new whenever one of its items changes: what recall built from a message
        # stays valid while the stamp does (stamps only grow, across reloads too).
        self._message_stamps: dict[tuple[str, str], int] = {}
        # Each conversation's messages in time order, so a message's neighbours are a bisect away.
        self._timelines: dict[tuple[str, str | None], list[tuple[datetime, tuple[str, str]]]] = {}
        self._placed: dict[tuple[str, str], tuple[tuple[str, str | None], datetime]] = {}
        self._bulk = False
        self._stamp = 0
        self._by_subject: dict[str, set[str]] = defaultdict(set)
        self._by_session: dict[str, set[str]] = defaultdict(set)  # what each chat's messages made
        # Items by UTC day of creation, in time order (notes read the newest few of a busy day without
        # sorting it every turn); the same per chat, so a chat's notes (chat scope) read its own items.
        self._by_day: dict[date, list[tuple[datetime, str]]] = {}
        self._by_session_day: dict[tuple[str, date], list[tuple[datetime, str]]] = {}
        self._listeners: list[ChangeListener] = []
        self._writer = GroupWriter("memory-writer")
        self.generation = 0  # bumped on every change

    @property
    def root(self) -> Path:
        return self._root

    @property
    def damaged(self) -> bool:
        """Whether a log holds lines the load could not read (kept aside; :meth:`compact` drops them)."""
        return bool(self._damaged)

    def path_for(self, item: MemoryItem) -> Path:
        return self._log_path(_log_of(item))

    def _log_path(self, where: tuple[Layer, date | None]) -> Path:
        layer, day = where
        if day is not None:
            return self._root / "episodic" / f"{day.isoformat()}.jsonl"
        return self._root / f"{layer.value}.jsonl"

    # -- reading ----------------------------------------------------------------------------------

    async def load(self) -> None:
        with collector_paused() as paused:  # millions of objects at 100,000 items, none of them garbage
            await self._load()
            paused.freeze = len(self._items) >= FREEZE_AT

    async def _load(self) -> None:
        loaded, lines, self._damaged = await asyncio.to_thread(self._read_all)
        self._items = {i.id: i for i in loaded.values() if not i.deleted}
        self._by_fingerprint.clear()
        self._merges = {self._merge_key(i): i.id for i in self._items.values()}
        self._by_message.clear()
        self._timelines.clear()
        self._placed.clear()
        self._by_subject.clear()
        self._by_session.clear()
        self._by_day.clear()
        self._by_session_day.clear()
        self._bulk = True  # timelines are appended to, then sorted once
        for item in self._items.values():
            _file(self._by_fingerprint, item.fingerprint, item.id, add=True)
            self._index(item, add=True)
        self._bulk = False
        for table in (self._timelines, self._by_day, self._by_session_day):
            for entries in table.values():
                entries.sort()
        self._lines = defaultdict(int, lines)
        self.generation += 1
        for listener in self._listeners:
            listener(None, None)

    def subscribe(self, listener: ChangeListener) -> None:
        """Call ``listener`` on every change of the live items (retrieval keeps its index current)."""
        self._listeners.append(listener)

    def _read_all(self) -> tuple[dict[str, MemoryItem], dict[Path, int], set[Path]]:
        """Every item's last version: from the snapshot plus the logs' tails when it holds, else from
        every line of every log; and the logs found holding damaged lines (kept aside)."""
        ensure_private_dir(self._root)
        ensure_private_dir(self._root / "episodic")
        logs = sorted(self._root.glob("*.jsonl")) + sorted((self._root / "episodic").glob("*.jsonl"))
        snap = item_snapshot.read(self._root)
        damaged_logs: set[Path] = set()
        if snap is not None:
            found = self._read_tails(snap, logs, damaged_logs)
            if found is not None:
                return (*found, damaged_logs)
            log.info("memory_snapshot_stale", reason="a log was rewritten since it was taken")
            damaged_logs.clear()  # read again below, whole
        items: dict[str, MemoryItem] = {}
        lines = {path: _parse_into(items, path.read_bytes(), path, damaged_logs) for path in logs}
        return items, lines, damaged_logs

    def _read_tails(
        self, snap: item_snapshot.Snapshot, logs: list[Path], damaged_logs: set[Path]
    ) -> tuple[dict[str, MemoryItem], dict[Path, int]] | None:
        items = {item.id: item for item in snap.items}
        lines: dict[Path, int] = {}
        if any(not (self._root / rel).exists() for rel in snap.logs):
            return None
        for path in logs:
            mark = snap.logs.get(str(path.relative_to(self._root)))
            with path.open("rb") as f:
                st = os.fstat(f.fileno())
                if mark is None:  # a log the snapshot never saw: read it whole
                    lines[path] = _parse_into(items, f.read(), path, damaged_logs)
                    continue
                if st.st_ino != mark.inode or st.st_size < mark.size:
                    return None
                f.seek(mark.size)
                lines[path] = mark.lines + _parse_into(items, f.read(), path, damaged_logs, start=mark.size)
        return items, lines

    async def save_snapshot(self) -> bool:
        """Write the snapshot of the live items (after every queued line is on disk); best effort.

        Not while a log holds damaged lines: the next load would read only past them, and the running
        bot, which rewrites such a log at its start, would never learn of them."""
        if self._damaged:
            return False
        items = list(self._items.values())
        lines = dict(self._lines)
        try:
            return await self._writer.call(functools.partial(item_snapshot.write, self._root, items, lines))
        except OSError as exc:
            log.warning("memory_snapshot_not_saved", error=repr(exc))
            return False

    def items(self, layer: Layer | None = None) -> list[MemoryItem]:
        return [i for i in self._items.values() if layer is None or i.layer is layer]

    def of_message(self, key: tuple[str, str]) -> list[MemoryItem]:
        """The live items made from one message (its passages, typed sentences, promoted copies)."""
        return [self._items[i] for i in self._by_message.get(key, ()) if i in self._items]

    def stamp_of(self, key: tuple[str, str]) -> int:
        """The message's current stamp (see ``_message_stamps``); 0 for one with no items."""
        return self._message_stamps.get(key, 0)

    def passages(self, key: tuple[str, str]) -> list[MemoryItem]:
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

    def neighbours(
        self, key: tuple[str, str], *, within: timedelta = NEIGHBOUR_SPAN
    ) -> list[tuple[str, str]]:
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

    def __len__(self) -> int:
        return len(self._items)

    def get(self, item_id: str) -> MemoryItem | None:
        return self._items.get(item_id)

    def count(self, layer: Layer) -> int:
        return sum(1 for i in self._items.values() if i.layer is layer)

    # -- writing ----------------------------------------------------------------------------------

    async def add(self, item: MemoryItem) -> MemoryItem:
        return (await self.add_many([item]))[0]

    async def add_many(self, items: Iterable[MemoryItem], *, sync: bool = True) -> list[MemoryItem]:
        """Store new items; one that repeats a live item of its layer merges into it instead.

        ``sync=False``: written at once, fsynced by a later :meth:`sync` (items that can be made again
        from where they came from, should a power cut lose them first)."""
        stored = self._merge_in(items)
        await self._write(stored, sync=sync)
        return stored

    async def sync(self) -> None:
        """fsync what :meth:`add_many` wrote with ``sync=False``."""
        await self._writer.sync()

    def _merge_in(self, items: Iterable[MemoryItem]) -> list[MemoryItem]:
        stored: list[MemoryItem] = []
        for item in items:
            existing_id = self._merges.get(self._merge_key(item))
            existing = self._items.get(existing_id) if existing_id else None
            stored.append(existing.merged_with(item, item.updated_at) if existing else item)
            self._remember(stored[-1])
        return stored

    async def put(self, item: MemoryItem) -> MemoryItem:
        """Write a new version of an item as is (update, touch, tombstone)."""
        await self.put_many([item])
        return item

    async def put_many(self, items: Iterable[MemoryItem]) -> None:
        """Write new versions of many items with one append per file (decay touches thousands)."""
        batch = list(items)
        for item in batch:
            self._remember(item)
        await self._write(batch)

    async def delete(self, item_id: str, now: datetime) -> MemoryItem | None:
        item = self._items.get(item_id)
        if item is None:
            return None
        await self.put(item.with_changes(deleted=True, updated_at=now))
        return item

    def touch(self, item_id: str, now: datetime) -> None:
        """Record use in memory only; the item's next written version carries it to disk."""
        self.touch_many((item_id,), now)

    def touch_many(self, item_ids: Iterable[str], now: datetime) -> None:
        """:meth:`touch` for each of ``item_ids``: a turn touches every item behind its pack."""
        due = now - TOUCH_RESOLUTION  # last used at or before it: touched again
        items = self._items
        for item_id in item_ids:
            item = items.get(item_id)
            if item is not None and item.last_accessed_at <= due:
                items[item_id] = item.with_changes(last_accessed_at=now)
                self._touched.add(item_id)

    async def flush_touches(self) -> int:
        """Write the last use of touched items (one append per file), so a restart keeps it for decay."""
        touched = [self._items[i] for i in self._touched if i in self._items]
        self._touched.clear()
        if touched:
            await self.put_many(touched)
        return len(touched)

    def _remember(self, item: MemoryItem) -> None:
        self._touched.discard(item.id)  # this version carries the last use to disk
        old = self._items.get(item.id)
        if old is not None:
            if self._merges.get(key := self._merge_key(old)) == old.id:
                del self._merges[key]
            _file(self._by_fingerprint, old.fingerprint, old.id, add=False)
            self._index(old, add=False)
        if item.deleted:
            self._items.pop(item.id, None)
        else:
            self._items[item.id] = item
            self._merges[self._merge_key(item)] = item.id
            _file(self._by_fingerprint, item.fingerprint, item.id, add=True)
            self._index(item, add=True)
        self.generation += 1
        before = old if old is not None and retrievable(old) else None
        after = item if retrievable(item) else None
        if before is not None or after is not None:
            for listener in self._listeners:
                listener(before, after)

    def _merge_key(self, item: MemoryItem) -> tuple[Layer, str, str]:
        """What a repeat must share to merge: layer and fingerprint, and with ``per_chat`` the chat."""
        chat = item.references[0].session_id if self._per_chat and item.references else ""
        return item.layer, item.fingerprint, chat

    async def separate_chats(self) -> int:
        """Split every item whose references name several chats into one item per chat (the first
        chat keeps the id), so that none shows one chat's message to another. For ``per_chat`` stores
        whose items merged across chats before: returns how many items were split."""
        versions: list[MemoryItem] = []
        split = 0
        for item in [i for i in self._items.values() if len(i.references) > 1]:
            chats = list(dict.fromkeys(ref.session_id for ref in item.references))
            if len(chats) < 2:
                continue
            split += 1
            for n, chat in enumerate(chats):
                refs = tuple(r for r in item.references if r.session_id == chat)
                if n == 0:
                    versions.append(item.with_changes(references=refs))
                else:  # a copy of its own: any promotion of it is made anew, within its chat
                    versions.append(item.with_changes(id=new_id(), references=refs, promoted_to=None))
        if versions:
            await self.put_many(versions)
        return split

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

    def _place(self, key: tuple[str, str], line: tuple[str, str | None], at: datetime) -> None:
        if key in self._placed:
            return
        self._placed[key] = (line, at)
        self._file_in_time(self._timelines, line, (at, key), add=True)

    def _unplace(self, key: tuple[str, str]) -> None:
        placed = self._placed.pop(key, None)
        if placed is None:
            return
        line, at = placed
        self._file_in_time(self._timelines, line, (at, key), add=False)

    async def _write(self, items: list[MemoryItem], *, sync: bool = True) -> None:
        """Queue the items' lines (one payload per file) and wait until they are durable (written)."""
        await _all_written(self._submit(items, sync=sync))

    def _submit(self, items: list[MemoryItem], *, sync: bool = True) -> list[asyncio.Future[None]]:
        """Queue the items' lines now, in the order of the changes; the futures of their writes."""
        groups: dict[Path, list[str]] = defaultdict(list)
        for item in items:
            groups[self.path_for(item)].append(json.dumps(item.to_dict(), ensure_ascii=False))
        writes = []
        for path, lines in groups.items():
            self._lines[path] += len(lines)
            writes.append(self._writer.submit(path, ("\n".join(lines) + "\n").encode("utf-8"), sync=sync))
        return writes

    async def drain(self) -> None:
        """Wait until every change made so far is on disk."""
        await self._writer.drain()

    # -- lifecycle of items -----------------------------------------------------------------------

    async def promote(
        self, now: datetime, threshold: float, candidates: Iterable[MemoryItem] | None = None
    ) -> list[MemoryItem]:
        """Copy confident episodic items into their durable layer; the episodic item remembers the copy.

        ``candidates`` limits the look to items just written (a turn's), instead of every episodic item
        (maintenance). Deciding and recording happen without a pause, so two turns never promote the
        same item twice; the copies and the marks are then written together.
        """
        pool = (
            self.items(Layer.EPISODIC) if candidates is None else [self._items.get(i.id) for i in candidates]
        )
        due = [
            item
            for item in pool
            if item is not None
            and item.layer is Layer.EPISODIC
            and not item.promoted_to
            and item.confidence >= threshold
            and promoted_layer(item.type) is not None
        ]
        if not due:
            return []
        copies = self._merge_in(
            MemoryItem(
                layer=promoted_layer(item.type) or Layer.SEMANTIC,
                type=item.type,
                title=item.title,
                content=item.content,
                tags=item.tags,
                source="promotion",
                confidence=item.confidence,
                salience=max(item.salience, 0.6),
                created_at=item.created_at,
                updated_at=now,
                last_accessed_at=now,
                references=item.references,
            )
            for item in due
        )
        marks = [
            item.with_changes(promoted_to=copy.id, updated_at=now)
            for item, copy in zip(due, copies, strict=True)
        ]
        for mark in marks:
            self._remember(mark)
        await self._write(copies + marks)
        return copies

    async def decay(self, now: datetime, days: int) -> int:
        """Halve the salience of episodic items nobody used for ``days``; nothing is deleted.

        Promoted items are left alone (their durable copy carries on), and the transcript archive and
        daily notes keep the full record, so decay only changes ranking. It goes :data:`MAINTENANCE_STEP`
        items at a time: after a month without the bot every item is due, and 100,000 of them in one go
        held every chat's turns for 5 s.
        """
        stale = now - timedelta(days=days)

        def fading(item: MemoryItem | None) -> TypeGuard[MemoryItem]:
            return (
                item is not None
                and item.layer is Layer.EPISODIC
                and not item.promoted_to
                and item.last_accessed_at <= stale
                and item.salience > MIN_SALIENCE
            )

        due = [item.id for item in self._items.values() if fading(item)]
        writes: list[asyncio.Future[None]] = []
        count = 0
        for start in range(0, len(due), MAINTENANCE_STEP):
            if start:
                await asyncio.sleep(0)  # the chats' turns go on between two steps
            # A step decides from the items as they are now (a turn may have changed one since the list
            # was made) and records with no await in between.
            faded = [
                item.with_changes(
                    salience=max(MIN_SALIENCE, item.salience * DECAY_FACTOR),
                    updated_at=now,
                    last_accessed_at=now,
                )
                for item in map(self._items.get, due[start : start + MAINTENANCE_STEP])
                if fading(item)
            ]
            for item in faded:
                self._remember(item)
            writes += self._submit(faded)
            count += len(faded)
        await _all_written(writes)
        return count

    async def compact(self) -> int:
        """Rewrite logs holding at least twice as many lines as live items, or a damaged line (kept
        aside at load: a record a kill cut short would stay in the middle of the log); return files
        rewritten.

        A log that another process (``membot memory import`` next to the running bot) appended to
        since we read it is left alone: rewriting it from our view would drop that process's items.
        """
        # Counted by log (layer and day), not by path: a Path per item made this ~0.5 s at 100,000 items,
        # all of it holding up the chats' turns.
        live = Counter(map(_log_of, self._items.values()))
        named = {self._log_path(where): where for where in live}
        due = [
            path
            for path, lines in self._lines.items()
            if path in self._damaged
            or (lines >= 8 and lines >= 2 * (live[named[path]] if path in named else 0))
        ]
        if not due:
            return 0
        keep: dict[tuple[Layer, date | None], list[MemoryItem]] = {named[p]: [] for p in due if p in named}
        for item in self._items.values():
            kept = keep.get(_log_of(item))
            if kept is not None:
                kept.append(item)
        # Every rewrite is queued now, with the line counts and items of this moment (no await since they
        # were read): each lands after the lines queued so far and before any queued later. Their lines
        # are made in the writer's thread, so a big log holds up no turn for long.
        queued = []
        for path in due:
            where = named.get(path)
            items, lines = keep[where] if where is not None else [], self._lines[path]
            rewrite = functools.partial(_rewrite_if_unchanged, self._root, path, lines, items)
            queued.append((path, lines, len(items), self._writer.submit_call(rewrite)))
        results = await asyncio.gather(*(done for *_, done in queued), return_exceptions=True)
        rewritten, error = 0, None
        for (path, lines, kept_count, _), result in zip(queued, results, strict=True):
            if isinstance(result, BaseException):
                error = error or result
            elif result:
                self._lines[path] += kept_count - lines  # lines queued meanwhile stay
                self._damaged.discard(path)
                rewritten += 1
            else:
                log.warning("memory_items_changed_elsewhere", file=path.name)
        if error is not None:
            raise error
        return rewritten


def _parse_into(
    items: dict[str, MemoryItem], data: bytes, path: Path, damaged_logs: set[Path], *, start: int = 0
) -> int:
    """Apply a log's lines (last version wins, tombstones remove) and return how many lines it held.

    ``data`` is the log from byte ``start`` on. A damaged line costs only itself, and is kept aside
    (``bot/damaged.py``); the log is then added to ``damaged_logs``, for compaction to rewrite without it.
    """
    count = 0
    unreadable: list[damaged.DamagedLine] = []
    for offset, raw in damaged.lines(data):
        count += 1
        try:  # bytes, so one damaged line costs that line, not the file
            item = MemoryItem.from_dict(json.loads(raw))
        except damaged.UNREADABLE as exc:  # a torn last line, or damage
            unreadable.append(damaged.DamagedLine(start + offset, raw, damaged.describe(exc)))
            continue
        if item.deleted:
            items.pop(item.id, None)
        else:
            items[item.id] = item
    if damaged.keep_aside(path, unreadable, event="memory_item_lines_set_aside") is not None:
        damaged_logs.add(path)
    return count


def _file(table: dict[K, set[str]], key: K, item_id: str, *, add: bool) -> None:
    """Add ``item_id`` under ``key``, or take it out (dropping a key left empty)."""
    if add:
        table[key].add(item_id)
        return
    ids = table.get(key)
    if ids is not None:
        ids.discard(item_id)
        if not ids:
            del table[key]


def _rewrite_if_unchanged(root: Path, path: Path, lines: int, items: list[MemoryItem]) -> bool:
    """Replace a log with ``items`` unless someone appended to it; the snapshot (which marks where this
    log ended) is voided first, since the new file may even get the old one's inode number."""
    try:
        on_disk = item_snapshot.count_lines(path.read_bytes())
    except FileNotFoundError:
        on_disk = 0
    if on_disk != lines:
        return False
    item_snapshot.remove(root)
    atomic_write_text(path, "".join(json.dumps(i.to_dict(), ensure_ascii=False) + "\n" for i in items))
    return True


async def _all_written(writes: list[asyncio.Future[None]]) -> None:
    """Wait for every write, then raise the first failure: a full disk fails them all, and each
    failure left unread would be logged again as never retrieved."""
    for result in await asyncio.gather(*writes, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result


def _log_of(item: MemoryItem) -> tuple[Layer, date | None]:
    """Which log holds ``item``: its layer, and for episodic items the day it was made."""
    return item.layer, item.created_at.date() if item.layer is Layer.EPISODIC else None
