"""ItemStore: the live MemoryItems and their logs, with dedup, promotion, decay and compaction.

The logs are JSON lines per layer (episodic per day), append-only: ``bot/memory/item_logs.py``. What
lookups find is filed in an :class:`~bot.memory.item_index.ItemIndex` the store keeps current
(:attr:`ItemStore.index`). An item that repeats a live one of its layer merges into it; with
``per_chat`` (memory.scope = "chat") only within one chat, since a merged item belongs to every chat its
references name and shows the message of its first. All live items are kept in memory, so retrieval
never touches the disk; ``compact`` rewrites a log atomically when it holds mostly old versions, or a
damaged line the load set aside (a record a kill cut short: it would stay in the middle of the log).

Every change is made in memory at once (no await between deciding and recording it, so concurrent
chats never act on a stale view: an item is promoted once) and then written by a :class:`GroupWriter`,
which commits the lines of all chats waiting at that moment with one fsync per file.

A ``read_only`` store (``membot memory search|show|stats`` beside the running bot) loads without
changing a byte (item_logs.py) and writes nothing: what the bot would change at its start (separating
chats' items) it changes in memory only, and a write is a bug (``RuntimeError``).
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TypeGuard

import structlog

from bot.domain import new_id
from bot.group_writer import GroupWriter
from bot.heap import collector_paused
from bot.memory import item_logs, item_snapshot
from bot.memory.item_index import ItemIndex, retrievable
from bot.memory.items import STANDALONE_SOURCES, Layer, MemoryItem, promoted_layer

log = structlog.get_logger(__name__)

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
        self._lines: dict[Path, int] = defaultdict(int)
        self._damaged: set[Path] = set()  # logs holding lines the load could not read (kept aside)
        # Per log, the newest version of each item a failed append left out (a tombstone too): written
        # again with the log's next append, or by the next snapshot (_left_out).
        self._unwritten: dict[Path, dict[str, MemoryItem]] = {}
        self._touched: set[str] = set()  # ids whose last use is newer in memory than on disk
        self._listeners: list[ChangeListener] = []
        self._writer = GroupWriter("memory-writer")
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
        return bool(self._damaged)

    def path_for(self, item: MemoryItem) -> Path:
        return item_logs.log_path(self._root, item_logs.log_of(item))

    # -- reading ----------------------------------------------------------------------------------

    async def load(self) -> None:
        with collector_paused() as paused:  # millions of objects at 100,000 items, none of them garbage
            await self._load()
            paused.freeze = len(self._items) >= FREEZE_AT

    async def _load(self) -> None:
        loaded, lines, self._damaged = await asyncio.to_thread(
            item_logs.read_logs, self._root, read_only=self._read_only
        )
        self._items = {i.id: i for i in loaded.values() if not i.deleted}
        self._merges = {self._merge_key(i): i.id for i in self._items.values()}
        self._index.rebuild(self._items)
        self._lines = defaultdict(int, lines)
        self.generation += 1
        for listener in self._listeners:
            listener(None, None)

    def subscribe(self, listener: ChangeListener) -> None:
        """Call ``listener`` on every change of the live items (retrieval keeps its index current)."""
        self._listeners.append(listener)

    async def save_snapshot(self) -> bool:
        """Write the snapshot of the live items (after every queued line is on disk); best effort.

        Not while a log holds damaged lines: the next load would read only past them, and the running
        bot, which rewrites such a log at its start, would never learn of them. The versions a failed
        append left out (a full disk) are appended first; while one still is in memory only, no snapshot:
        the next start would take it as stored, and not record its message again (or bring back an item
        forgotten since)."""
        if self._damaged or self._read_only:
            return False
        try:
            if self._unwritten:
                await _all_written(self._submit([], logs=list(self._unwritten)))
            if self._unwritten:  # (left out again since, by another append)
                return False
            items = list(self._items.values())
            lines = dict(self._lines)
            return await self._writer.call(functools.partial(item_snapshot.write, self._root, items, lines))
        except OSError as exc:
            log.warning("memory_snapshot_not_saved", error=repr(exc))
            return False

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
        await _all_written(self._submit(items, sync=sync))

    def _submit(
        self, items: list[MemoryItem], *, sync: bool = True, logs: Iterable[Path] = ()
    ) -> list[asyncio.Future[None]]:
        """Queue the items' lines now, in the order of the changes, each log's with the versions a failed
        append left out of it (``logs``: those logs too, with nothing new); the futures of their writes.

        The store keeps account of each write on the writer's own future (``_written``), which its
        callers never cancel (``_all_written``).
        """
        if self._read_only:
            raise RuntimeError(f"the item store under {self._root} was opened read-only")
        groups: dict[Path, list[MemoryItem]] = defaultdict(list)
        for item in items:
            groups[self.path_for(item)].append(item)
        for path in logs:
            groups.setdefault(path, [])
        writes = []
        for path, group in groups.items():
            group[:0] = self._left_out(path, group)
            if not group:
                continue
            self._lines[path] += len(group)
            payload = "".join(item_logs.line_of(item) + "\n" for item in group).encode("utf-8")
            write = self._writer.submit(path, payload, sync=sync)
            write.add_done_callback(functools.partial(self._written, path, group))
            writes.append(write)
        return writes

    def _left_out(self, path: Path, group: list[MemoryItem]) -> list[MemoryItem]:
        """What a failed append left out of ``path`` and ``group`` does not write anew: each item's
        version of now (a later one carries it), and the tombstone of one forgotten."""
        left = self._unwritten.get(path)
        if not left:
            return []
        new = {item.id for item in group}
        versions = []
        for item_id, version in left.items():
            if item_id in new:
                continue
            if (current := self._items.get(item_id)) is not None:
                versions.append(current)
            elif version.deleted:  # (a version not deleted of an item gone: its tombstone is on its way)
                versions.append(version)
        return versions

    def _written(self, path: Path, group: list[MemoryItem], write: asyncio.Future[None]) -> None:
        """Keep account of an append: a failed one (a full disk) left none of its lines in the log
        (``append_bytes``), and the versions it held are in memory only until an append or a rewrite of
        their log stores them. Counted as the log's, those lines made it look appended to by another
        process until a restart: no snapshot was saved and the log was never compacted."""
        left = self._unwritten.setdefault(path, {})
        if write.exception() is None:
            for item in group:
                left.pop(item.id, None)
        else:
            self._lines[path] -= len(group)
            left.update((item.id, item) for item in group)  # the newest of each id last
        if not left:
            del self._unwritten[path]

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
        if self._read_only:
            return 0
        # Counted by log (layer and day), not by path: a Path per item made this ~0.5 s at 100,000 items,
        # all of it holding up the chats' turns.
        live = Counter(map(item_logs.log_of, self._items.values()))
        named = {item_logs.log_path(self._root, where): where for where in live}
        due = [
            path
            for path, lines in self._lines.items()
            if path in self._damaged
            or (lines >= 8 and lines >= 2 * (live[named[path]] if path in named else 0))
        ]
        if not due:
            return 0
        keep: dict[item_logs.Where, list[MemoryItem]] = {named[p]: [] for p in due if p in named}
        for item in self._items.values():
            kept = keep.get(item_logs.log_of(item))
            if kept is not None:
                kept.append(item)
        # Every rewrite is queued now, with the line counts and items of this moment (no await since they
        # were read): each lands after the lines queued so far and before any queued later. Their lines
        # are made in the writer's thread, so a big log holds up no turn for long.
        queued = []
        for path in due:
            where = named.get(path)
            items, lines = keep[where] if where is not None else [], self._lines[path]
            rewrite = functools.partial(item_logs.rewrite_if_unchanged, self._root, path, lines, items)
            left = dict(self._unwritten.get(path, {}))  # the versions of this moment are in the rewrite
            queued.append((path, lines, len(items), left, self._writer.submit_call(rewrite)))
        results = await asyncio.gather(*(done for *_, done in queued), return_exceptions=True)
        rewritten, error = 0, None
        for (path, lines, kept_count, left, _), result in zip(queued, results, strict=True):
            if isinstance(result, BaseException):
                error = error or result
            elif result:
                self._lines[path] += kept_count - lines  # lines queued meanwhile stay
                self._damaged.discard(path)
                # Rewritten from memory: the versions a failed append left out are in it now (not
                # one left out later, by an append queued behind the rewrite).
                still = self._unwritten.get(path, {})
                for item_id, version in left.items():
                    if still.get(item_id) is version:
                        del still[item_id]
                if not still:
                    self._unwritten.pop(path, None)
                rewritten += 1
            else:
                log.warning("memory_items_changed_elsewhere", file=path.name)
        if error is not None:
            raise error
        return rewritten


async def _all_written(writes: list[asyncio.Future[None]]) -> None:
    """Wait for every write, then raise the first failure: a full disk fails them all, and each
    failure left unread would be logged again as never retrieved.

    Shielded: a caller cancelled meanwhile (/stop, a timeout) cancelled the writes' futures, and the
    store's account of them (``ItemStore._written``) went with it: a failed append stayed counted as
    lines of its log, and the versions it held were taken for stored."""
    for result in await asyncio.shield(asyncio.gather(*writes, return_exceptions=True)):
        if isinstance(result, BaseException):
            raise result
