"""The on-disk form of the vector store: one append-only file of fixed-size records per embedding model.

A file is a 512-byte header (``membot-vectors 1`` and a JSON line naming the model id and dimension,
padded with spaces) followed by records of a 32-byte key (an item fingerprint, ASCII, NUL-padded) and
the unit vector in little-endian float16 (800 bytes a record at 384 dimensions).

Why this shape: keys and vectors live in one record, so they can never disagree; a record has a fixed
size, so a torn tail (a kill mid-append) is found by arithmetic and cut back to the last whole record,
costing only the batch being written; loading is one ``numpy.fromfile`` with no parsing per record.
Writers (the bot, and ``membot memory import`` next to it) take an exclusive lock on ``.lock`` in the
folder for every append or rewrite, and each picks up the records the other appended since it last
looked. A rewrite (compaction, a full reindex) replaces the file atomically; a writer that notices the
new inode re-reads the file before it appends. Every function here blocks: call it in a thread.

Appends are not fsynced one by one (:func:`sync` does it, at close): vectors are derived data. A power
cut can cost the records written since, or leave their bytes zeroed; a zeroed record fails validation
(a unit vector under a printable key) and is skipped, and an item without a vector is embedded again
when the next start submits every item. A kill costs nothing (the kernel has the bytes). An fsync per
batch cost a message at a human pace one more fsync.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.typing import NDArray

from bot.storage import FILE_MODE, append_bytes, atomic_write_bytes, ensure_private_dir, sync_paths

HEADER_BYTES = 512
KEY_BYTES = 32
MAGIC = b"membot-vectors 1\n"
SUFFIX = ".vec"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_KEY = re.compile(rf"[\x21-\x7e]{{1,{KEY_BYTES}}}")


class VectorFileError(ValueError):
    """The file is not a vector file of the expected model (its header is unreadable or names another)."""


@dataclass(frozen=True, slots=True)
class Records:
    """What a read found: keys and rows (float32, as scored) in file order; a repeated key: last wins."""

    keys: list[str]
    vectors: NDArray[np.float32]
    end: int  # byte offset just past the last whole record
    inode: int
    skipped: int = 0  # records that failed validation (bit rot, a crash mid-write)
    torn: int = 0  # bytes of an incomplete last record


def file_for(folder: Path, model_id: str) -> Path:
    """``folder/<model id>.vec``; ids with characters unfit for a file name get a hash suffix."""
    slug = _UNSAFE.sub("_", model_id).strip("._")[:80] or "model"
    if slug != model_id:
        slug += "-" + hashlib.sha256(model_id.encode()).hexdigest()[:8]
    return folder / (slug + SUFFIX)


def header(model_id: str, dim: int) -> bytes:
    meta = json.dumps({"model": model_id, "dim": dim, "dtype": "<f2", "key_bytes": KEY_BYTES}).encode()
    if len(MAGIC) + len(meta) + 1 > HEADER_BYTES:
        raise VectorFileError(f"embedding model id too long for a vector file: {model_id[:60]}…")
    return MAGIC + meta.ljust(HEADER_BYTES - len(MAGIC) - 1) + b"\n"


def record_dtype(dim: int) -> np.dtype[np.void]:
    return np.dtype([("key", f"S{KEY_BYTES}"), ("vec", "<f2", (dim,))])


def read_header(path: Path, model_id: str) -> int:
    """The dimension of ``path``'s vectors; :class:`VectorFileError` if it is not ``model_id``'s file."""
    with path.open("rb") as f:
        return _header_dim(f, path.name, model_id)


def _header_dim(f: BinaryIO, name: str, model_id: str) -> int:
    """:func:`read_header` on an open file, read from its start (a reader reads the header and the
    records from one descriptor: a rewrite between two opens would mix one file's header with
    another's records)."""
    f.seek(0)
    raw = f.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES or not raw.startswith(MAGIC):
        raise VectorFileError(f"{name} has no vector file header")
    try:
        meta = json.loads(raw[len(MAGIC) :])
        model, dim = str(meta["model"]), int(meta["dim"])
    except (ValueError, KeyError, TypeError) as exc:
        raise VectorFileError(f"{name} has an unreadable header: {exc}") from exc
    if model != model_id:
        raise VectorFileError(f"{name} holds vectors of {model!r}, not {model_id!r}")
    if dim <= 0 or meta.get("dtype") != "<f2" or meta.get("key_bytes") != KEY_BYTES:
        raise VectorFileError(f"{name} has a vector layout this version does not read")
    return dim


def read(path: Path, model_id: str, start: int = HEADER_BYTES) -> tuple[int, Records]:
    """The dimension and the valid records from byte ``start`` on (the whole file by default), all
    from one open of the file, so that a rewrite meanwhile is either all seen or not at all."""
    with path.open("rb") as f:
        dim = _header_dim(f, path.name, model_id)
        rtype = record_dtype(dim)
        stat = os.fstat(f.fileno())
        whole = (stat.st_size - HEADER_BYTES) // rtype.itemsize
        end = HEADER_BYTES + whole * rtype.itemsize
        first = max(0, (start - HEADER_BYTES) // rtype.itemsize)
        f.seek(HEADER_BYTES + first * rtype.itemsize)
        raw = np.fromfile(f, dtype=rtype, count=whole - first)
    torn = stat.st_size - end
    rows = raw["vec"].astype(np.float32)
    squares = np.einsum("ij,ij->i", rows, rows)  # several times faster than linalg.norm here
    good = np.isfinite(squares) & (np.abs(squares - 1.0) < 0.1) & _valid_keys(raw["key"])
    skipped = len(raw) - int(good.sum())
    if skipped:
        rows, raw = rows[good], raw[good]
    keys = [k.decode("ascii") for k in raw["key"].tolist()]
    return dim, Records(keys, rows, end, stat.st_ino, skipped, torn)


def valid_key(key: str) -> bool:
    """Whether ``key`` fits a record (1-32 printable ASCII characters, no spaces): fingerprints do."""
    return bool(_KEY.fullmatch(key))


def _valid_keys(keys: NDArray[np.bytes_]) -> NDArray[np.bool_]:
    """Keys that start with a printable ASCII byte and hold nothing but printable bytes and NULs."""
    codes = np.ascontiguousarray(keys).view(np.uint8).reshape(len(keys), KEY_BYTES)
    printable = (codes > 0x20) & (codes < 0x7F)
    return np.asarray(printable[:, 0] & (printable | (codes == 0)).all(axis=1), dtype=np.bool_)


def encode(keys: list[str], vectors: NDArray[np.float16]) -> bytes:
    """Records for ``keys`` (ASCII, at most 32 bytes each) and their float16 rows."""
    out = np.empty(len(keys), dtype=record_dtype(vectors.shape[1]))
    out["key"] = [k.encode("ascii") for k in keys]
    out["vec"] = vectors
    return out.tobytes()


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold the folder's writer lock (``.lock``, never replaced, so every writer locks the same inode)."""
    ensure_private_dir(folder)
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


@dataclass(frozen=True, slots=True)
class Appended:
    """After an append: the file's new end and inode, and what changed behind the writer's back."""

    end: int
    inode: int
    others: Records | None = None  # records another writer appended since the caller last looked
    replaced: bool = False  # the file was rewritten elsewhere: ``others`` is all of it, drop the rest


def append(
    path: Path, model_id: str, keys: list[str], vectors: NDArray[np.float16], seen_end: int, seen_inode: int
) -> Appended:
    """Append records under the lock, first cutting a torn tail and reading what others wrote."""
    dim = vectors.shape[1]
    with locked(path.parent):
        size, inode = _stat(path)
        if size < HEADER_BYTES or (size == HEADER_BYTES and read_header(path, model_id) != dim):
            append_bytes(path, header(model_id, dim), truncate_to=0)  # new, or torn while being made
            size, inode = _stat(path)
        if read_header(path, model_id) != dim:
            raise VectorFileError(f"{path.name} holds vectors of another dimension than {dim}")
        others: Records | None = None
        rtype = record_dtype(dim)
        whole_end = HEADER_BYTES + (size - HEADER_BYTES) // rtype.itemsize * rtype.itemsize
        replaced = inode != seen_inode or whole_end < seen_end
        if replaced:
            _, others = read(path, model_id)
        elif whole_end > seen_end:
            _, others = read(path, model_id, start=seen_end)
        # Cuts a torn tail first; fsynced by :func:`sync` (see the module doc).
        end = append_bytes(path, encode(keys, vectors), truncate_to=whole_end, sync=False)
        return Appended(end, inode, others, replaced)


def sync(path: Path) -> None:
    """fsync what :func:`append` wrote, after an append under way (nothing to do without the file)."""
    if not path.parent.exists():
        return
    with locked(path.parent):
        sync_paths([path])


def rewrite(
    path: Path, model_id: str, dim: int, keys: list[str], vectors: NDArray[np.float16]
) -> tuple[int, int]:
    """Replace the file atomically with exactly these records; return its (end, inode)."""
    data = header(model_id, dim) + (encode(keys, vectors) if keys else b"")
    with locked(path.parent):
        atomic_write_bytes(path, data)
        return _stat(path)


def _stat(path: Path) -> tuple[int, int]:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return 0, 0
    return stat.st_size, stat.st_ino
