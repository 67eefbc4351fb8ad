"""The on-disk form of the lexical index: its base's numpy arrays and a JSON header, in one ``.npz``.

The header names the format, the ``signature`` of what the documents were made with, the keys, the
terms and each key's version (what its document was made from); the arrays are the base's postings by
term (``offsets``, ``docs``, ``tfs``) and the documents' ``lengths``. The file is written atomically and
read whole: a missing, torn, truncated or foreign one reads as ``None``, and the index is then built
again from the items. Both functions block: call them in a thread.
"""

from __future__ import annotations

import io
import json
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bot.storage import atomic_write_bytes

FORMAT = 1


@dataclass(frozen=True, slots=True)
class SavedIndex:
    """What the file holds: ``versions`` runs beside ``keys``, ``offsets`` has one entry more than ``terms``
    (term ``i``'s postings are ``docs[offsets[i]:offsets[i + 1]]`` and the same slice of ``tfs``)."""

    signature: str
    keys: list[str]
    terms: list[str]
    versions: list[str]
    offsets: NDArray[Any]
    docs: NDArray[Any]
    tfs: NDArray[Any]
    lengths: NDArray[Any]


def write(path: Path, saved: SavedIndex) -> None:
    """Write ``saved`` at ``path`` atomically."""
    buffer = io.BytesIO()
    header = {
        "format": FORMAT,
        "signature": saved.signature,
        "keys": saved.keys,
        "terms": saved.terms,
        "versions": saved.versions,
    }
    np.savez(
        buffer,
        header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
        offsets=saved.offsets,
        docs=saved.docs,
        tfs=saved.tfs,
        lengths=saved.lengths,
    )
    atomic_write_bytes(path, buffer.getvalue())


def read(path: Path) -> SavedIndex | None:
    """What :func:`write` wrote at ``path``; ``None`` if it is missing, unreadable or inconsistent."""
    try:
        # Opened here: np.load leaves its own file open when the zip is torn.
        with path.open("rb") as file, np.load(file) as data:
            header = json.loads(bytes(data["header"]).decode())
            if header.get("format") != FORMAT:
                return None
            offsets, docs = data["offsets"], data["docs"]
            tfs, lengths = data["tfs"], data["lengths"]
        keys, terms = [str(k) for k in header["keys"]], [str(t) for t in header["terms"]]
        versions = [str(v) for v in header.get("versions", [])]
    # A torn or truncated file: zipfile and zlib raise their own errors, an empty one EOFError.
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        EOFError,
        zipfile.BadZipFile,
        zlib.error,
    ):
        return None
    if len(offsets) != len(terms) + 1 or len(lengths) != len(keys) or len(docs) != len(tfs):
        return None
    if len(versions) != len(keys) or (len(docs) and (docs.max() >= len(keys) or docs.min() < 0)):
        return None
    signature = str(header.get("signature", ""))
    return SavedIndex(signature, keys, terms, versions, offsets, docs, tfs, lengths)
