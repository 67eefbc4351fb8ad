"""A snapshot of the live items beside their logs: a start reads one file instead of parsing every line.

Parsing 100,000 JSON lines into items took ~5 s at every start. The store writes ``items/snapshot.bin``
at shutdown and after maintenance: every live item, plus each log file's inode, size and line count at
that moment. The next load takes the items from it and parses only what was appended to each log since
(its tail), and any log it does not know whole. A log that was rewritten (compaction), shrank or went
away makes the snapshot void: everything is read from the logs, as without one. The logs stay the
record; the snapshot is only a faster way to read them, and deleting it is always safe.

It is pickles (the fastest way to rebuild 100,000 frozen dataclasses in CPython): a header (how many
items, the logs' marks), then the items in lists of :data:`CHUNK`, each a pickle of its own. One pickle
of every item kept a memo of millions of entries, and building and freeing it held the interpreter for
up to a quarter of a second at a time, while every chat's turn waited (the running bot saves a snapshot
at its daily maintenance). A file whose items do not add up is not used. It lives in the
workspace's private ``memory/items/`` folder (0700), which tools cannot write; anyone who can write
there can already change every memory, so loading it grants nothing new. It is written only after
checking that every log holds exactly the lines the store knows of, so a line another process appended
(``membot memory import`` beside the bot) is never hidden behind the snapshot.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.memory.items import MemoryItem
from bot.storage import atomic_write_bytes

SNAPSHOT = "snapshot.bin"
MAGIC = b"membot items snapshot 2\n"  # 1: one pickle of everything (read as void: the logs are read)
CHUNK = 2_000  # items per pickle


@dataclass(frozen=True, slots=True)
class LogMark:
    inode: int
    size: int
    lines: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    items: list[MemoryItem]
    logs: dict[str, LogMark]  # path relative to the items folder -> where the snapshot stopped reading


def count_lines(data: bytes) -> int:
    """Non-blank lines, split at ``\\n`` only, as the store's reader counts them (bot/damaged.py)."""
    return sum(1 for raw in data.split(b"\n") if raw.strip())


def write(root: Path, items: Iterable[MemoryItem], lines: Mapping[Path, int]) -> bool:
    """Save ``items`` with the current marks of the logs in ``lines`` (blocking). ``False``, and nothing
    written, when a log holds other lines than the store counted (someone else appended)."""
    logs: dict[str, LogMark] = {}
    for path, expected in lines.items():
        try:
            data = path.read_bytes()
            st = os.stat(path)
        except FileNotFoundError:
            if expected:
                return False
            continue
        if count_lines(data) != expected:
            return False
        logs[str(path.relative_to(root))] = LogMark(st.st_ino, len(data), expected)
    items = list(items)
    out = io.BytesIO()
    out.write(MAGIC)
    pickle.dump({"items": len(items), "logs": logs}, out, protocol=pickle.HIGHEST_PROTOCOL)
    for start in range(0, len(items), CHUNK):
        pickle.dump(items[start : start + CHUNK], out, protocol=pickle.HIGHEST_PROTOCOL)
    atomic_write_bytes(root / SNAPSHOT, out.getvalue())
    return True


def read(root: Path) -> Snapshot | None:
    """The saved snapshot, or ``None`` if there is none or it cannot be used."""
    try:
        data = (root / SNAPSHOT).read_bytes()
    except OSError:
        return None
    if not data.startswith(MAGIC):
        return None
    stream = io.BytesIO(data)
    stream.seek(len(MAGIC))
    items: list[MemoryItem] = []
    try:  # damaged or from another version: read the logs instead
        header: Any = pickle.load(stream)
        while stream.tell() < len(data):
            items += pickle.load(stream)
        whole = header["items"] == len(items) and isinstance(header["logs"], dict)
    except Exception:
        return None
    if not whole or not all(isinstance(item, MemoryItem) for item in items):
        return None
    return Snapshot(items, header["logs"])


def remove(root: Path) -> None:
    """Void the snapshot (before a rewrite of the logs it describes)."""
    (root / SNAPSHOT).unlink(missing_ok=True)
