"""WordIndex: the lexical index of an item store, kept current, saved beside the items, loaded at start.

It follows every change of the :class:`ItemStore` (a listener: the new item's terms go into the index's
in-memory delta). At start it loads ``items/lexical.npz`` — the base the last run saved — and checks it
against the items: a document whose item changed or went away is masked, an item it lacks is indexed
now; only when there is no usable file is everything tokenized again (in a thread). When the delta has
grown, it is folded into a new base in a thread while queries go on against the old one; changes made
meanwhile are replayed onto the new one. :meth:`save` writes the base at shutdown and maintenance, so
the next start reads arrays instead of re-tokenizing 100,000 items.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import structlog

from bot.memory.item_index import retrievable
from bot.memory.item_store import ItemStore
from bot.memory.items import MemoryItem
from bot.memory.lexical import Frequencies, LexicalIndex
from bot.memory.words import tokenize

log = structlog.get_logger(__name__)

INDEX_FILE = "lexical.npz"
MERGE_AT = 5000  # delta documents that make a merge worthwhile (or a fifth of the base, if more)


def frequencies(item: MemoryItem) -> Frequencies:
    counts: dict[str, int] = {}
    for token in tokenize(f"{item.title} {item.content}"):
        counts[token] = counts.get(token, 0) + 1
    return counts


def version(item: MemoryItem) -> str:
    """What an item's index entry was made from: a new content or title is a new version."""
    return hashlib.blake2b(f"{item.fingerprint}\n{item.title}".encode(), digest_size=8).hexdigest()


Change = tuple[MemoryItem | None, MemoryItem | None]


class WordIndex:
    def __init__(self, store: ItemStore) -> None:
        self._store = store
        self._path = store.root / INDEX_FILE
        self.index = LexicalIndex()
        self._stale = True  # the store (re)loaded: load or build the index before the next query
        self._replaying: list[Change] | None = None  # changes kept while a new index is being made
        self._merging: asyncio.Task[None] | None = None
        store.subscribe(self._changed)

    # -- following the store ------------------------------------------------------------------------

    def _changed(self, old: MemoryItem | None, new: MemoryItem | None) -> None:
        if old is None and new is None:
            self._stale = True
            return
        if self._replaying is not None:
            self._replaying.append((old, new))
        if not self._stale:
            self._apply(self.index, old, new)
            self._merge_when_due()

    @staticmethod
    def _apply(index: LexicalIndex, old: MemoryItem | None, new: MemoryItem | None) -> None:
        if new is None:
            if old is not None:
                index.remove(old.id)
            return
        changed = old is None or (old.fingerprint, old.title) != (new.fingerprint, new.title)
        if changed or new.id not in index:
            index.upsert(new.id, frequencies(new))

    # -- start: load, check, or build -------------------------------------------------------------

    async def ready(self) -> None:
        """Make the index match the store (after a load): from the saved file where it is still true."""
        while self._stale:
            self._stale = False
            self._replaying = []
            try:
                items = [i for i in self._store.items() if retrievable(i)]
                index = await asyncio.to_thread(self._load_or_build, self._path, items)
            finally:
                changes, self._replaying = self._replaying or [], None
            for old, new in changes:
                self._apply(index, old, new)
            self.index = index

    @staticmethod
    def _load_or_build(path: Path, items: Sequence[MemoryItem]) -> LexicalIndex:
        loaded = LexicalIndex.load(path)
        if loaded is None:
            return _build(items)
        index, _, versions = loaded
        current = {item.id: item for item in items}
        for key, made_from in versions.items():
            item = current.get(key)
            if item is None or version(item) != made_from:
                index.remove(key)
        for item in items:
            if item.id not in index:
                index.upsert(item.id, frequencies(item))
        return index

    # -- merging and saving ---------------------------------------------------------------------

    def _merge_when_due(self) -> None:
        index = self.index
        due = index.delta_size >= max(MERGE_AT, len(index) // 5)
        if due and (self._merging is None or self._merging.done()) and self._replaying is None:
            self._merging = asyncio.get_running_loop().create_task(self._merge(), name="memory-index-merge")

    async def _merge(self) -> None:
        self._replaying = []
        try:
            merged = await asyncio.to_thread(self.index.copy().merged)
        except Exception:  # a background task must not die silently; the old index keeps working
            log.exception("memory_index_merge_failed")
            self._replaying = None
            return
        changes, self._replaying = self._replaying, None
        for old, new in changes:
            self._apply(merged, old, new)
        self.index = merged

    async def save(self) -> None:
        """Write the index beside the items (a thread; best effort: the next start can rebuild); never
        for a read-only store (the index it built stays in memory)."""
        if self._stale or self._store.read_only:
            return
        if self._merging is not None:
            await asyncio.gather(self._merging, return_exceptions=True)
        index, items = self.index.copy(), self._store.items()

        def save() -> None:
            # Hashed in the thread: at 100,000 items this held up every chat's turns ~0.1 s on the loop.
            versions = {item.id: version(item) for item in items if retrievable(item)}
            index.save(self._path, "", versions)

        try:
            await asyncio.to_thread(save)
        except OSError as exc:
            log.warning("memory_index_not_saved", error=repr(exc))


def _build(items: Iterable[MemoryItem]) -> LexicalIndex:
    index = LexicalIndex()
    for item in items:
        index.upsert(item.id, frequencies(item))
    return index.merged()
