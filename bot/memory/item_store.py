"""ItemStore: the live MemoryItems and their logs, with dedup, promotion, decay and compaction.

The logs are JSON lines per layer (episodic per day), append-only: ``bot/memory/item_logs.py``. What
lookups find is filed in an :class:`~bot.memory.item_index.ItemIndex` the store keeps current
(:attr:`ItemStore.index`). An item that repeats a live one of its layer merges into it; with
``per_chat`` (memory.scope = "chat") only within one chat, since a merged item belongs to every chat its
references name and shows the message of its first. All live items are kept in memory, so retrieval
never touches the disk; ``compact`` rewrites a log atomically when it holds mostly old versions, or a
damaged line the load set aside (a record a kill cut short: it would stay in the middle of the log).

Every change is made in memory at once (no await between deciding and recording it, so concurrent
chats never act on a stale view: an item is promoted once) and then written by an
:class:`~bot.memory.item_writer.ItemWriter` (``bot/memory/item_writer.py``), which keeps the account of
what each log holds and writes the snapshot and the compacted logs too.

A ``read_only`` store (``membot memory search|show|stats`` beside the running bot) loads without
changing a byte (item_logs.py) and writes nothing: what the bot would change at its start (separating
chats' items) it changes in memory only, and a write is a bug (``RuntimeError``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TypeGuard

from bot.domain import new_id
from bot.heap import collector_paused
from bot.memory import item_logs
from bot.memory.item_index import ItemIndex, retrievable
from bot.memory.item_writer import ItemWriter, all_written
from bot.memory.items import STANDALONE_SOURCES, Layer, MemoryItem, promoted_layer

FREEZE_AT = 10_000  # items whose load is frozen from the collector afterwards (bot/heap.py)

DECAY_FACTOR = 0.5
MIN_SALIENCE = 0.05
# Last use is kept to the hour: decay counts in days, and a new version per recall per turn cost more
# than the recall itself.
TOUCH_RESOLUTION = timedelta(hours=1)
# Items maintenance changes at a time before the chats' turns get the loop back (a few ms each step).
MAINTENANCE_STEP = 100

ChangeListener = Callable[[MemoryItem | None, MemoryItem | None], None]
"""Told ``(old, new)`` for every change of the live set: ``old`` None for a new item, ``new`` None for a
removed one (forgotten, or hidden behind its promoted copy). ``(None, None)`` means "reload everything"."""


class ItemStore:
    """The live set of items plus its on-disk logs (see the module doc)."""

    def __init__(self, root: Path, *, per_chat: bool = False, read_only: bool = False) -> None:
        self._root = root
        self._per_chat = per_chat
        self._read_only = read_only
        self._items: dict[str, MemoryItem] = {}
        self._index = ItemIndex(self._items)
        self._merges: dict[tuple[Layer, str, str], str] = {}  # what a repeat merges into (_merge_key)
        self._logs = ItemWriter(root, read_only=read_only)
        self._touched: set[str] = set()  # ids whose last use is newer in memory than on disk
        self._listeners: list[ChangeListener] = []
        self.generation = 0  # bumped on every change

    @property
    def root(self) -> Path:
        return self._root

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def index(self) -> ItemIndex:
        """The lookups over the live items (by message, day, subject, ...), current after every change."""
        return self._index

    @property
    def damaged(self) -> bool:
        """Whether a log holds lines the load could not read (kept aside; :meth:`compact` drops them)."""
        return self._logs.damaged

    def path_for(self, item: MemoryItem) -> Path:
        return self._logs.path_for(item)

    # -- reading ----------------------------------------------------------------------------------

    async def load(self) -> None:
        with collector_paused() as paused:  # millions of objects at 100,000 items, none of them garbage
            await self._load()
            paused.freeze = len(self._items) >= FREEZE_AT

    async def _load(self) -> None:
        loaded, lines, damaged = await asyncio.to_thread(
            item_logs.read_logs, self._root, read_only=self._read_only
        )
        self._logs.loaded(lines, damaged)
        self._items = {i.id: i for i in loaded.values() if not i.deleted}
        self._merges = {self._merge_key(i): i.id for i in self._items.values()}
        self._index.rebuild(self._items)
        self.generation += 1
        for listener in self._listeners:
            listener(None, None)

    def subscribe(self, listener: ChangeListener) -> None:
        """Call ``listener`` on every change of the live items (retrieval keeps its index current)."""
        self._listeners.append(listener)

    async def save_snapshot(self) -> bool:
        """Write the snapshot of the live items; best effort (:meth:`ItemWriter.save_snapshot`: when not)."""
        return await self._logs.save_snapshot(self._items)

    def items(self, layer: Layer | None = None) -> list[MemoryItem]:
        return [i for i in self._items.values() if layer is None or i.layer is layer]

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
        await self._logs.sync()

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
        """Forget an item: gone from memory at once; its tombstone, should a full disk refuse it, is
        appended again later (with its log's next append, or by the next snapshot)."""
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
        if old is not None and self._merges.get(key := self._merge_key(old)) == old.id:
            del self._merges[key]
        if item.deleted:
            self._items.pop(item.id, None)
        else:
            self._items[item.id] = item
            self._merges[self._merge_key(item)] = item.id
        self._index.update(old, None if item.deleted else item)
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
        if versions and self._read_only:  # as the bot will have them, in memory only
            for version in versions:
                self._remember(version)
        elif versions:
            await self.put_many(versions)
        return split

    async def _write(self, items: list[MemoryItem], *, sync: bool = True) -> None:
        """Queue the items' lines (one payload per file) and wait until they are durable (written)."""
        await self._logs.write(items, self._items, sync=sync)

    async def drain(self) -> None:
        """Wait until every change made so far is on disk."""
        await self._logs.drain()

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
                # A fact of its own stays one: as "promotion" it was taken for a part of the message it
                # references (a consolidation's: the batch's first), and that message was shown instead.
                source=item.source if item.source in STANDALONE_SOURCES else "promotion",
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
            writes += self._logs.submit(faded, self._items)
            count += len(faded)
        await all_written(writes)
        return count

    async def compact(self) -> int:
        """Rewrite the logs that hold mostly old versions or a damaged line; return files rewritten
        (:meth:`ItemWriter.compact`: which, and the logs another process appended to, left alone)."""
        return await self._logs.compact(self._items)
