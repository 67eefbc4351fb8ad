"""VectorTable: one embedding model's vectors, in their file and in memory, kept in step.

:class:`~bot.memory.vectors.VectorStore` decides what gets embedded and when (its background worker);
this is where the vectors then live. The file (``vector_file.py``) and the rows a query scores
(:class:`~bot.memory.vector_matrix.Matrix`) change together, one file operation at a time in this
process: loading the file, appending a batch (with what another process appended since, read back),
rewriting it (a new dimension, a compaction, a reset). A file that cannot be read is moved aside, since
the vectors are derived and are made again from the items.

``read_only`` is for a reader beside the running bot (``membot memory search``), which owns the file
and may be appending to it: it only loads, never locks, cuts, moves aside or rewrites. A torn last
record (an append under way) is left out of what it reads, as every load leaves it out, and not
reported: it is no damage there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from pathlib import Path

import numpy as np
import structlog
from numpy.typing import NDArray

from bot.memory import vector_file
from bot.memory.vector_matrix import Matrix

log = structlog.get_logger(__name__)


class VectorTable:
    """The vectors of ``model_id`` in ``path`` and in memory (see the module doc). ``on_replace`` is told
    whenever the rows are replaced whole (the query cache goes with them)."""

    def __init__(
        self, path: Path, model_id: str, on_replace: Callable[[], None], *, read_only: bool = False
    ) -> None:
        self.path = path
        self.model_id = model_id
        self.read_only = read_only
        self._on_replace = on_replace
        self._matrix = Matrix()
        self._end = 0
        self._inode = 0
        self._write = asyncio.Lock()  # one file operation at a time in this process

    @property
    def matrix(self) -> Matrix:
        """The rows as they are now (replaced whole by a load or a rewrite)."""
        return self._matrix

    async def load(self) -> None:
        try:
            loaded = await asyncio.to_thread(self._read)
        except (vector_file.VectorFileError, OSError) as exc:
            if self.read_only:  # the bot's to move aside (or its header is still being written)
                log.warning("vectors_unreadable", file=self.path.name, error=str(exc), left_for="the bot")
                return
            if not isinstance(exc, vector_file.VectorFileError | IsADirectoryError):
                raise
            # (a folder in its place never becomes readable: the start failed on it, "Is a directory";
            # the vectors are derived, and made again from the items)
            moved = self.path.with_name(self.path.name + ".unreadable")
            await asyncio.to_thread(self.path.replace, moved)
            log.warning("vectors_unreadable", file=self.path.name, moved_to=moved.name, error=str(exc))
            return
        if loaded is None:
            return
        records, matrix = loaded
        self._replace(records, matrix)
        if records.skipped or (records.torn and not self.read_only):
            log.warning(
                "vectors_damaged",
                file=self.path.name,
                skipped_records=records.skipped,
                torn_bytes=records.torn,
            )
        loaded_log = log.debug if self.read_only else log.info  # a reader's note says what it lacks
        loaded_log("vectors_loaded", model=self.model_id, count=len(self._matrix))

    def _read(self) -> tuple[vector_file.Records, Matrix] | None:
        if not self.path.exists():
            return None
        records = vector_file.read(self.path, self.model_id)[1]
        return records, Matrix(records.keys, records.vectors)

    def _replace(self, records: vector_file.Records, matrix: Matrix) -> None:
        self._matrix = matrix
        self._end, self._inode = records.end, records.inode
        self._on_replace()

    def _writable(self) -> None:
        if self.read_only:
            raise RuntimeError(f"{self.path} was opened read-only")

    async def store(self, keys: list[str], vectors: NDArray[np.float32]) -> None:
        self._writable()
        halves = vectors.astype(np.float16)
        async with self._write:
            if self._matrix.dim not in (None, halves.shape[1]):
                old = self._matrix.dim
                log.warning("vectors_dimension_changed", model=self.model_id, old=old, new=halves.shape[1])
                await self._rewrite([], halves[:0])
            done = await asyncio.to_thread(
                vector_file.append, self.path, self.model_id, keys, halves, self._end, self._inode
            )
            others = done.others
            if others is not None and done.replaced:
                rebuilt = await asyncio.to_thread(Matrix, others.keys, others.vectors)
                self._replace(others, rebuilt)
            elif others is not None:
                await asyncio.to_thread(self._matrix.reserve, len(others.keys), halves.shape[1])
                self._matrix.add(others.keys, others.vectors)
            await asyncio.to_thread(self._matrix.reserve, len(keys), halves.shape[1])
            self._matrix.add(keys, halves.astype(np.float32))  # as a reload will read them back
            self._end, self._inode = done.end, done.inode

    async def _rewrite(self, keys: list[str], vectors: NDArray[np.float16]) -> None:
        """Replace this model's file with exactly these vectors (caller holds ``_write``)."""
        self._writable()
        end, inode = await asyncio.to_thread(
            vector_file.rewrite, self.path, self.model_id, vectors.shape[1], keys, vectors
        )
        rows = vectors.astype(np.float32)
        self._replace(vector_file.Records(keys, rows, end, inode), Matrix(keys, rows))

    async def compact(self, live: Collection[str]) -> int:
        """Drop the vectors of fingerprints not in ``live`` once they are at least half the file.

        Returns how many were dropped (0 when it was not worth a rewrite). Run it from maintenance.
        """
        async with self._write:
            dead = len(self._matrix) - sum(1 for key in self._matrix.keys if key in live)
            if not dead or dead * 2 < len(self._matrix):
                return 0
            keep = [key for key in self._matrix.keys if key in live]
            rows = self._matrix.view()[[self._matrix.rows[k] for k in keep]].astype(np.float16)
            await self._rewrite(keep, rows)
        log.info("vectors_compacted", model=self.model_id, dropped=dead, kept=len(keep))
        return dead

    async def reset(self) -> None:
        """Forget every vector of this model (``membot memory reindex --full``)."""
        async with self._write:
            if self._matrix.dim is not None:
                empty = np.zeros((0, self._matrix.dim), dtype=np.float16)
                await self._rewrite([], empty)
