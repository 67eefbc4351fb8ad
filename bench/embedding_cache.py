"""A bench-only embedder wrapper that remembers vectors by text, within a run and across runs
(``--embedding-cache FILE``).

The recall benches embed the same turns again and again: LongMemEval's haystacks share most of their
sessions, and every run repeats the last one. The model's answer for a text never changes, so a text
is embedded once per run (once ever with ``FILE``, a numpy ``.npz``) and the benches measure memory,
not an hour of model time. A vector is kept under its model's id and its text, so a changed model
never reads another model's vectors. Figures are identical to embedding every time; the model's own cost per
message is measured by ``bench/embeddings_eval.py`` and ``bench/vectors.py``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


class CachedEmbedder:
    def __init__(self, inner: Any, path: Path | None, *, save_to: Path | None = None) -> None:
        """Vectors are read from ``path`` and the shards beside it (``<stem>.<pid>.npz``); the ones this
        process had to compute are saved to its own shard (``save_to``, by default named by pid), so
        parallel workers never write the same file. Without ``path`` they live only in this process."""
        self._inner = inner
        self._path = save_to or (path.with_name(f"{path.stem}.{os.getpid()}.npz") if path else None)
        self.model_id = inner.model_id
        self._known: dict[str, np.ndarray] = {}
        self._fresh: dict[str, np.ndarray] = {}
        for file in sorted(path.parent.glob(f"{path.stem}*.npz")) if path else ():
            with np.load(file) as data:
                keys, vectors = data["keys"], data["vectors"]
                self._known.update((str(k), v) for k, v in zip(keys, vectors, strict=True))

    def _key(self, text: str) -> str:
        named = f"{self.model_id}\0{text}".encode("utf-8", "surrogatepass")
        return hashlib.blake2b(named, digest_size=16).hexdigest()

    async def embed(self, texts: Sequence[str]) -> Any:
        keys = [self._key(t) for t in texts]
        missing = [i for i, k in enumerate(keys) if k not in self._known]
        if missing:
            fresh = await self._inner.embed([texts[i] for i in missing])
            for i, vector in zip(missing, fresh, strict=True):
                self._known[keys[i]] = self._fresh[keys[i]] = np.asarray(vector, dtype=np.float32)
        return np.stack([self._known[k] for k in keys])

    def save(self) -> None:
        if self._fresh and self._path is not None:
            keys = np.array(list(self._fresh), dtype="U32")
            np.savez(self._path, keys=keys, vectors=np.stack(list(self._fresh.values())))
