"""The vectors in memory: a unit row (float32, as scored) per key, grown without stalling the loop.

The vector store (``vectors.py``) holds one :class:`Matrix` for its model, rebuilt from the file at
start and grown as the background worker embeds; query-time search (``vector_search.py``) scores a
query against :meth:`Matrix.view`. Rows are only ever appended or overwritten in place, so the row
indices a search took stay valid while the store grows.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray


class Matrix:
    """Unit rows (float32, as scored) with a key per row; a repeated key overwrites its row.

    Built from a file's records in a thread, adopting their array (100,000 rows are ~150 MB), then
    grown by :meth:`add`. Room is made ahead with :meth:`reserve`, also in a thread, so the event loop
    never copies the matrix; a scoring thread that holds the old array keeps a valid view of it.
    """

    def __init__(self, keys: list[str] | None = None, vectors: NDArray[np.float32] | None = None) -> None:
        keys = keys or []
        self.rows: dict[str, int] = dict(zip(keys, range(len(keys)), strict=True))  # last one wins
        self._data: NDArray[np.float32] | None = None
        if vectors is None or not keys:
            self.keys: list[str] = []
            return
        if len(self.rows) != len(keys):
            picked = np.fromiter(self.rows.values(), dtype=np.int64, count=len(self.rows))
            keys, vectors = list(self.rows), vectors[picked]
            self.rows = dict(zip(keys, range(len(keys)), strict=True))
        self.keys = list(keys)
        self._data = np.ascontiguousarray(vectors, dtype=np.float32)  # full: the first add grows it

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def dim(self) -> int | None:
        return None if self._data is None else self._data.shape[1]

    def view(self) -> NDArray[np.float32]:
        assert self._data is not None
        return self._data[: len(self.keys)]

    def pick(self, keys: Iterable[str]) -> NDArray[np.int64]:
        """The rows of ``keys`` that have one, in their first order, each once."""
        rows = self.rows
        found = [row for key in dict.fromkeys(keys) if (row := rows.get(key)) is not None]
        return np.array(found, dtype=np.int64)

    def reserve(self, extra: int, dim: int) -> None:
        """Make room for ``extra`` more rows of ``dim`` (blocking: the copy of a large matrix)."""
        if self._data is None or self._data.shape[1] != dim:
            self.keys, self.rows = [], {}
            self._data = np.empty((_capacity(extra), dim), dtype=np.float32)
        elif len(self.keys) + extra > len(self._data):
            grown = np.empty((_capacity(len(self.keys) + extra), dim), dtype=np.float32)
            grown[: len(self.keys)] = self._data[: len(self.keys)]
            self._data = grown

    def add(self, keys: list[str], vectors: NDArray[np.float32]) -> None:
        if not keys:
            return
        self.reserve(len(keys), vectors.shape[1])  # a no-op when the caller reserved already
        assert self._data is not None
        for key, vector in zip(keys, vectors, strict=True):
            row = self.rows.get(key)
            if row is None:
                row = len(self.keys)
                self._data[row] = vector  # the row first, then the key: a reader never sees a blank row
                self.keys.append(key)
                self.rows[key] = row
            else:
                self._data[row] = vector


def _capacity(rows: int) -> int:
    return max(1024, rows + rows // 4)


def unit(vectors: object) -> NDArray[np.float32]:
    """``vectors`` (one row per text, as an embedder answers) as float32 rows of length 1."""
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim != 2:
        raise ValueError(f"the embedder answered an array of shape {matrix.shape}, not one row per text")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.asarray(matrix / np.maximum(norms, 1e-12), dtype=np.float32)
