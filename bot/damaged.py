"""Damaged lines of a journal: kept aside beside it and reported, never silently dropped.

membot's journals (session logs, the inbox, memory items, the usage journal) are read line by line, so
a damaged line (torn by a crash, bad UTF-8, valid JSON that is not a record) costs only itself. What it
held may still be someone's words, so before a journal is cut or rewritten without it, its bytes are
kept in ``<journal>.damaged-<hash>`` beside the journal, and the reader logs what was set aside, where
it stood and where it went. The name comes from the bytes: reading the same damage again (every start,
until the journal is rewritten) keeps one copy, not one per start.

    damaged: list[DamagedLine] = []
    for offset, raw in lines(data):
        try:
            record = decode(raw)
        except UNREADABLE as exc:
            damaged.append(DamagedLine(offset, raw, describe(exc)))
    keep_aside(path, damaged, event="inbox_lines_set_aside")
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from bot.domain import utcnow
from bot.storage import atomic_write_bytes

log = structlog.get_logger(__name__)

UNREADABLE: tuple[type[Exception], ...] = (
    ValueError,  # not JSON, not UTF-8, a value out of its set (an unknown role)
    KeyError,  # a field missing
    TypeError,  # a field of the wrong type (a list where an object belongs)
    AttributeError,  # the same, one level down (a number where an object with .get belongs)
    OverflowError,  # a number out of range (Infinity where an int belongs)
)
"""What decoding a damaged line raises, whatever the damage; anything else is a bug and propagates."""
UNREADABLE_FILE: tuple[type[Exception], ...] = (*UNREADABLE, OSError)
"""The same, for a whole file read and decoded at once."""

SUFFIX = ".damaged-"


@dataclass(frozen=True, slots=True)
class DamagedLine:
    """A line that could not be read: where it started (bytes into the file), its bytes, and why."""

    offset: int
    data: bytes
    reason: str


def lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """Each non-blank line of ``data`` with its offset; a line keeps its newline (the last may lack one)."""
    pos = 0
    while pos < len(data):
        newline = data.find(b"\n", pos)
        end = len(data) if newline < 0 else newline + 1
        if data[pos:end].strip():
            yield pos, data[pos:end]
        pos = end


def describe(exc: BaseException) -> str:
    """Why a line was unreadable, for the log (the exception's type and text, never the line itself)."""
    return f"{type(exc).__name__}: {exc}"[:200]


def aside_path(path: Path, data: bytes) -> Path:
    """Where ``data``, unreadable in ``path``, is kept: ``<path>.damaged-<hash of data>``."""
    return path.with_name(f"{path.name}{SUFFIX}{hashlib.sha256(data).hexdigest()[:16]}")


def corrupt_path(path: Path) -> Path:
    """Where a whole file that cannot be read (or a folder in its place) is kept when its bytes are not
    at hand: ``<path>.corrupt-<UTC time>``, a name of its own, so an earlier copy is never replaced."""
    return path.with_name(f"{path.name}.corrupt-{utcnow():%Y%m%dT%H%M%S%f}")


def move_aside(path: Path, raw: bytes, *, event: str, **context: object) -> Path:
    """Move a whole file that could not be read (its bytes ``raw``) to its :func:`aside_path`, kept for
    the operator where no later start reads it again, and log ``event`` (an error) saying where."""
    aside = aside_path(path, raw)
    path.replace(aside)
    log.error(event, path=str(path), kept_as=str(aside), **context)
    return aside


def set_aside(path: Path, damaged: Sequence[DamagedLine]) -> Path:
    """Write the damaged lines' bytes to ``<path>.damaged-<hash>`` (atomically, once; blocking)."""
    data = b"".join(d.data if d.data.endswith(b"\n") else d.data + b"\n" for d in damaged)
    target = aside_path(path, data)
    if not target.exists():
        atomic_write_bytes(target, data)
    return target


def keep_aside(path: Path, damaged: Sequence[DamagedLine], *, event: str, **context: object) -> Path | None:
    """Set ``damaged`` aside and log ``event`` (a warning) naming each line and the file that keeps it.

    Returns that file, or ``None`` when there was nothing to keep or it could not be written (logged as
    an error: the lines are still in the journal, and the next start tries again).
    """
    if not damaged:
        return None
    where = [{"at_byte": d.offset, "bytes": len(d.data), "reason": d.reason} for d in damaged]
    try:
        kept = set_aside(path, damaged)
    except OSError as exc:
        log.error(event, path=str(path), lines=where, kept_in=None, error=exc.strerror or str(exc), **context)
        return None
    log.warning(event, path=str(path), lines=where, kept_in=str(kept), **context)
    return kept
