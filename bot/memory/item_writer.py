"""ItemWriter: the item logs' write queue, and the account of what each log holds that comes with it.

:class:`~bot.memory.item_store.ItemStore` decides every change in memory; this is what puts it on disk.
The account it keeps changes only with the writes themselves: each log's line count (counted when a
write is queued, taken back when the disk refuses it), the logs holding damaged lines the load kept
aside, and the versions a failed append left out of a log (written again with its next append, or by
the next snapshot). The snapshot and compaction read and settle that account, so they are here too; the
store hands in its live items where one needs them.

All writes go through one :class:`GroupWriter`, which commits the lines of all chats waiting at that
moment with one fsync per file. A ``read_only`` writer writes nothing: a write is a bug
(``RuntimeError``).
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

import structlog

from bot.group_writer import GroupWriter
from bot.memory import item_logs, item_snapshot
from bot.memory.items import MemoryItem

log = structlog.get_logger(__name__)


class ItemWriter:
    """The writes to the item logs under ``root`` and their account (see the module doc)."""

    def __init__(self, root: Path, *, read_only: bool = False) -> None:
        self._root = root
        self._read_only = read_only
        self._lines: dict[Path, int] = defaultdict(int)
        self._damaged: set[Path] = set()  # logs holding lines the load could not read (kept aside)
        # Per log, the newest version of each item a failed append left out (a tombstone too): written
        # again with the log's next append, or by the next snapshot (_left_out).
        self._unwritten: dict[Path, dict[str, MemoryItem]] = {}
        self._writer = GroupWriter("memory-writer")

    @property
    def damaged(self) -> bool:
        """Whether a log holds lines the load could not read (kept aside; :meth:`compact` drops them)."""
        return bool(self._damaged)

    def loaded(self, lines: dict[Path, int], damaged: set[Path]) -> None:
        """Take the account of the logs as a load found them: each one's line count, the damaged ones."""
        self._damaged = damaged
        self._lines = defaultdict(int, lines)

    def path_for(self, item: MemoryItem) -> Path:
        return item_logs.log_path(self._root, item_logs.log_of(item))

    async def save_snapshot(self, live: Mapping[str, MemoryItem]) -> bool:
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
                await all_written(self.submit([], live, logs=list(self._unwritten)))
            if self._unwritten:  # (left out again since, by another append)
                return False
            items = list(live.values())
            lines = dict(self._lines)
            return await self._writer.call(functools.partial(item_snapshot.write, self._root, items, lines))
        except OSError as exc:
            log.warning("memory_snapshot_not_saved", error=repr(exc))
            return False

    async def sync(self) -> None:
        """fsync what was written with ``sync=False``."""
        await self._writer.sync()

    async def write(
        self, items: list[MemoryItem], live: Mapping[str, MemoryItem], *, sync: bool = True
    ) -> None:
        """Queue the items' lines (one payload per file) and wait until they are durable (written)."""
        await all_written(self.submit(items, live, sync=sync))

    def submit(
        self,
        items: list[MemoryItem],
        live: Mapping[str, MemoryItem],
        *,
        sync: bool = True,
        logs: Iterable[Path] = (),
    ) -> list[asyncio.Future[None]]:
        """Queue the items' lines now, in the order of the changes, each log's with the versions a failed
        append left out of it (``logs``: those logs too, with nothing new); the futures of their writes.

        The writer keeps account of each write on the group writer's own future (``_written``), which its
        callers never cancel (:func:`all_written`).
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
            group[:0] = self._left_out(path, group, live)
            if not group:
                continue
            self._lines[path] += len(group)
            payload = "".join(item_logs.line_of(item) + "\n" for item in group).encode("utf-8")
            write = self._writer.submit(path, payload, sync=sync)
            write.add_done_callback(functools.partial(self._written, path, group))
            writes.append(write)
        return writes

    def _left_out(
        self, path: Path, group: list[MemoryItem], live: Mapping[str, MemoryItem]
    ) -> list[MemoryItem]:
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
            if (current := live.get(item_id)) is not None:
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

    async def compact(self, live: Mapping[str, MemoryItem]) -> int:
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
        counts = Counter(map(item_logs.log_of, live.values()))
        named = {item_logs.log_path(self._root, where): where for where in counts}
        due = [
            path
            for path, lines in self._lines.items()
            if path in self._damaged
            or (lines >= 8 and lines >= 2 * (counts[named[path]] if path in named else 0))
        ]
        if not due:
            return 0
        keep: dict[item_logs.Where, list[MemoryItem]] = {named[p]: [] for p in due if p in named}
        for item in live.values():
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


async def all_written(writes: list[asyncio.Future[None]]) -> None:
    """Wait for every write, then raise the first failure: a full disk fails them all, and each
    failure left unread would be logged again as never retrieved.

    Shielded: a caller cancelled meanwhile (/stop, a timeout) cancelled the writes' futures, and the
    writer's account of them (``ItemWriter._written``) went with it: a failed append stayed counted as
    lines of its log, and the versions it held were taken for stored."""
    for result in await asyncio.shield(asyncio.gather(*writes, return_exceptions=True)):
        if isinstance(result, BaseException):
            raise result
