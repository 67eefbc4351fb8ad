"""GroupWriter: durable appends to line files, many callers' lines to one write and one fsync per file.

The item logs and the inbox take lines from every chat at once. Appending and fsyncing each caller's
lines under one lock made chats wait on each other's fsyncs (throughput capped at one append per
fsync), and an inbox done mark waited behind every message accepted before it. Here each caller
queues its lines and awaits them; one task writes everything queued so far — per file one write and
one fsync — while the next callers queue behind it (group commit). Lines
reach each file in the order they were queued, so "the last version of an item wins" holds on disk as
it does in memory.

A barrier (:meth:`call`) runs a blocking function between two groups, after everything queued before it
is on disk and before anything queued after it: log compaction rewrites a file through it.

    writer = GroupWriter("memory-writer")
    await writer.append(path, b'{"id": "a"}\\n')       # returns once the line is durable
    durable = writer.submit(path, b'{"id": "b"}\\n')   # its place is taken now, its fsync awaited later
    rewritten = await writer.call(lambda: rewrite(path))
    await writer.append(path, b'{"id": "c"}\\n', sync=False)  # written now, fsynced by ...
    await writer.sync()                                      # ... this, or a later synced append

``sync=False`` is for data that can be made again should a power cut lose it before :meth:`sync` (a
kill loses nothing either way: what was written is in the kernel's page cache).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bot.storage import append_bytes, sync_paths

T = TypeVar("T")


class GroupWriter:
    def __init__(self, name: str = "group-writer", *, editable: bool = False) -> None:
        """``editable``: the files are an operator's to edit (daily notes): an append waits for an
        editor's save in progress (``append_bytes``)."""
        self._name = name  # of the writing task, for tracebacks and task dumps
        self._editable = editable
        self._queue: list[tuple[Path | Callable[[], Any], bytes, asyncio.Future[Any], bool]] = []
        self._task: asyncio.Task[None] | None = None
        self._unsynced: set[Path] = set()
        self._new: set[Path] = set()  # of those, files such an append created (their folder needs a sync)

    async def append(self, path: Path, payload: bytes, *, sync: bool = True) -> None:
        """Append ``payload`` (whole lines) to ``path``; returns once it is fsynced (``sync=False``: once
        it is written; :meth:`sync` fsyncs it later)."""
        await self._enqueue(path, payload, sync=sync)

    @property
    def unsynced(self) -> bool:
        """Whether something appended with ``sync=False`` still waits for :meth:`sync`."""
        return bool(self._unsynced)

    async def sync(self) -> None:
        """fsync everything appended with ``sync=False`` before this call (and the files' folders)."""
        await self.call(self._sync_unsynced)

    def submit(self, path: Path, payload: bytes, *, sync: bool = True) -> asyncio.Future[None]:
        """Queue ``payload`` for ``path`` now and return the future of its fsync (``sync=False``: of its
        write): a caller that must fix its place in the file before its next await (the inbox's arrival
        order), or that need not wait at all (the usage journal), uses this."""
        future: asyncio.Future[None] = self._enqueue(path, payload, sync=sync)
        return future

    async def call(self, fn: Callable[[], T]) -> T:
        """Run blocking ``fn`` in a thread once everything queued before is written (a barrier)."""
        result: T = await self.submit_call(fn)
        return result

    def submit_call(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """:meth:`call`, its place taken now: the future of ``fn``'s result."""
        future: asyncio.Future[T] = self._enqueue(fn, b"")
        return future

    async def drain(self) -> None:
        """Wait until everything queued so far is written."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    def _enqueue(
        self, target: Path | Callable[[], Any], payload: bytes, *, sync: bool = True
    ) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((target, payload, future, sync))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=self._name)
        return future

    async def _run(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            group: list[tuple[Path, bytes, asyncio.Future[Any], bool]] = []
            for target, payload, future, sync in batch:
                if isinstance(target, Path):
                    group.append((target, payload, future, sync))
                    continue
                await self._write(group)  # everything before the barrier first
                group = []
                try:
                    _settle(future, result=await asyncio.to_thread(target))
                except Exception as exc:
                    _settle(future, error=exc)
            await self._write(group)

    async def _write(self, group: list[tuple[Path, bytes, asyncio.Future[Any], bool]]) -> None:
        if not group:
            return
        files: dict[Path, list[bytes]] = {}
        synced: set[Path] = set()  # a file one caller needs durable now is fsynced for all of them
        for path, payload, _, sync in group:
            files.setdefault(path, []).append(payload)
            if sync:
                synced.add(path)
        try:
            new, failed = await asyncio.to_thread(_append_all, files, synced, self._editable)
        except Exception as exc:  # (not a file's own failure: nothing is known to be durable)
            new, failed = set(), dict.fromkeys(files, exc)
        written = files.keys() - failed.keys()
        # A failed append fsynced nothing: what was written unsynced before it still waits for a sync.
        self._unsynced.difference_update(synced & written)
        self._unsynced.update(written - synced)
        self._new.update(new)
        for path, _, future, _ in group:
            # Each caller hears of its own file: one chat's full inbox file must not make another
            # chat's durable line count as not written (its message would be taken again as new).
            _settle(future, error=failed.get(path))

    def _sync_unsynced(self) -> None:
        paths, new = list(self._unsynced), list(self._new)
        sync_paths(paths, new=new)
        self._unsynced.difference_update(paths)
        self._new.difference_update(new)


def _append_all(
    files: dict[Path, list[bytes]], synced: set[Path], editable: bool
) -> tuple[set[Path], dict[Path, Exception]]:
    """Append each file's payloads: the files an unsynced append started (new or empty), and the
    failure of each file whose append failed (it left nothing of its payloads: ``append_bytes``)."""
    new: set[Path] = set()
    failed: dict[Path, Exception] = {}
    for path, payloads in files.items():
        data = b"".join(payloads)
        try:
            size = append_bytes(path, data, whole_lines=True, sync=path in synced, editable=editable)
        except Exception as exc:
            failed[path] = exc
            continue
        if path not in synced and size == len(data):
            new.add(path)
    return new, failed


def _settle(future: asyncio.Future[Any], *, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():  # the caller was cancelled: the write happened (or failed) all the same
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
