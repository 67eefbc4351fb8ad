"""A bench-only embedder wrapper that remembers vectors by text across runs (``--embedding-cache FILE``).

The recall benches embed the same ~50,000 turns every run: the model's answer for a text never changes,
so a run after the first reads them from ``FILE`` (a numpy ``.npz``) and measures retrieval, not an
hour of model time. Figures are identical to embedding every time; the model's cost per message is
measured by ``bench/vectors.py`` and ``bench/memory_e2e.py`` (which does not use this cache).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


class CachedEmbedder:
    def __init__(self, inner: Any, path: Path) -> None:
        self._inner = inner
        self._path = path
        self.model_id = inner.model_id
        self._known: dict[str, np.ndarray] = {}
        self._new = 0
        if path.exists():
            with np.load(path) as data:
                keys, vectors = data["keys"], data["vectors"]
                self._known = {str(k): v for k, v in zip(keys, vectors, strict=True)}

    @staticmethod
    def _key(text: str) -> str:
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()

    async def embed(self, texts: Sequence[str]) -> Any:
        keys = [self._key(t) for t in texts]
        missing = [i for i, k in enumerate(keys) if k not in self._known]
        if missing:
            fresh = await self._inner.embed([texts[i] for i in missing])
            for i, vector in zip(missing, fresh, strict=True):
                self._known[keys[i]] = np.asarray(vector, dtype=np.float32)
            self._new += len(missing)
        return np.stack([self._known[k] for k in keys])

    def save(self) -> None:
        if self._new:
            keys = np.array(list(self._known), dtype="U32")
            np.savez(self._path, keys=keys, vectors=np.stack(list(self._known.values())))
            self._new = 0
