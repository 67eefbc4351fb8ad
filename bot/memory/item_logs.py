"""The item logs on disk: where each item's versions go, reading them back, rewriting one.

Layout under ``items/``: ``episodic/YYYY-MM-DD.jsonl`` (by creation day), ``semantic.jsonl``,
``procedural.jsonl``. Each is an append-only log of item versions, one JSON object a line: the last
line for an id wins and a ``deleted`` version is a tombstone. The
:class:`~bot.memory.item_writer.ItemWriter` appends to them for the item store; what is here runs in a
thread (a load, a compaction's rewrite), never on the event loop.

A read-only load (``membot memory search|show|stats``, beside the running bot that owns the logs)
changes nothing: no folder made or moved aside, no damaged line kept aside. An unreadable line is
skipped and logged; the last line of a log without its newline is most likely one the bot is
appending at that moment, and is said to be.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from datetime import date
from pathlib import Path

import structlog

from bot import damaged
from bot.memory import item_snapshot
from bot.memory.items import Layer, MemoryItem
from bot.storage import atomic_write_text, ensure_private_dir

log = structlog.get_logger(__name__)

Where = tuple[Layer, date | None]
"""Which log: a layer, and for episodic items the day they were made."""


def log_of(item: MemoryItem) -> Where:
    """Which log holds ``item``: its layer, and for episodic items the day it was made."""
    return item.layer, item.created_at.date() if item.layer is Layer.EPISODIC else None


def log_path(root: Path, where: Where) -> Path:
    layer, day = where
    if day is not None:
        return root / "episodic" / f"{day.isoformat()}.jsonl"
    return root / f"{layer.value}.jsonl"


def line_of(item: MemoryItem) -> str:
    """The item's version as one log line, without its newline."""
    return json.dumps(item.to_dict(), ensure_ascii=False)


def read_logs(
    root: Path, *, read_only: bool = False
) -> tuple[dict[str, MemoryItem], dict[Path, int], set[Path]]:
    """Every item's last version, each log's line count, and the logs found
    holding damaged lines (kept aside; ``read_only``: skipped only): from the snapshot plus the logs'
    tails when it holds, else from every line of every log."""
    if not read_only:
        ensure_private_dir(root)
        ensure_private_dir(root / "episodic")
    logs = sorted(root.glob("*.jsonl")) + sorted((root / "episodic").glob("*.jsonl"))
    if read_only:
        logs = [path for path in logs if not path.is_dir()]  # (the bot moves it aside at its start)
    else:
        logs = [path for path in logs if not _folder_set_aside(path)]
    snap = item_snapshot.read(root)
    damaged_logs: set[Path] = set()
    parse = functools.partial(_parse_into, read_only=read_only)
    if snap is not None:
        found = _read_tails(root, snap, logs, damaged_logs, parse)
        if found is not None:
            return (*found, damaged_logs)
        log.info("memory_snapshot_stale", reason="a log was rewritten since it was taken")
        damaged_logs.clear()  # read again below, whole
    items: dict[str, MemoryItem] = {}
    lines = {path: parse(items, path.read_bytes(), path, damaged_logs) for path in logs}
    return items, lines, damaged_logs


def _folder_set_aside(path: Path) -> bool:
    """A folder where a log belongs holds no items and never becomes readable: the start failed on it
    ("Is a directory"). It is moved aside, kept and logged, and the log starts again at its next write."""
    if not path.is_dir():
        return False
    moved = path.with_name(f"{path.name}.folder-{os.getpid()}-{path.stat().st_mtime_ns}")
    os.replace(path, moved)
    log.error("memory_log_is_a_folder", log=str(path), moved_to=moved.name)
    return True


def _read_tails(
    root: Path,
    snap: item_snapshot.Snapshot,
    logs: list[Path],
    damaged_logs: set[Path],
    parse: Callable[..., int],
) -> tuple[dict[str, MemoryItem], dict[Path, int]] | None:
    items = {item.id: item for item in snap.items}
    lines: dict[Path, int] = {}
    if any(not (root / rel).exists() for rel in snap.logs):
        return None
    for path in logs:
        mark = snap.logs.get(str(path.relative_to(root)))
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            if mark is None:  # a log the snapshot never saw: read it whole
                lines[path] = parse(items, f.read(), path, damaged_logs)
                continue
            if st.st_ino != mark.inode or st.st_size < mark.size:
                return None
            f.seek(mark.size)
            lines[path] = mark.lines + parse(items, f.read(), path, damaged_logs, start=mark.size)
    return items, lines


def _parse_into(
    items: dict[str, MemoryItem],
    data: bytes,
    path: Path,
    damaged_logs: set[Path],
    *,
    start: int = 0,
    read_only: bool = False,
) -> int:
    """Apply a log's lines (last version wins, tombstones remove) and return how many lines it held.

    ``data`` is the log from byte ``start`` on. A damaged line costs only itself, and is kept aside
    (``bot/damaged.py``); the log is then added to ``damaged_logs``, for compaction to rewrite without it.
    ``read_only``: it is skipped and logged only (:func:`_skipped`), and the log still added.
    """
    count = 0
    unreadable: list[damaged.DamagedLine] = []
    for offset, raw in damaged.lines(data):
        count += 1
        try:  # bytes, so one damaged line costs that line, not the file
            item = MemoryItem.from_dict(json.loads(raw))
        except damaged.UNREADABLE as exc:  # a torn last line, or damage
            unreadable.append(damaged.DamagedLine(start + offset, raw, damaged.describe(exc)))
            continue
        if item.deleted:
            items.pop(item.id, None)
        else:
            items[item.id] = item
    if read_only:
        if unreadable:
            _skipped(path, unreadable, start + len(data))
            damaged_logs.add(path)
    elif damaged.keep_aside(path, unreadable, event="memory_item_lines_set_aside") is not None:
        damaged_logs.add(path)
    return count


def _skipped(path: Path, unreadable: list[damaged.DamagedLine], end: int) -> None:
    """Log the lines a read-only load skipped; a last one without its newline is most likely being
    appended by the running bot right now (a copy of it is the bot's to keep, should it stay torn)."""
    last = unreadable[-1]
    appending = last.offset + len(last.data) == end and not last.data.endswith(b"\n")
    where = [{"at_byte": d.offset, "bytes": len(d.data), "reason": d.reason} for d in unreadable]
    hint = (
        "the last line may still be being written by the running bot: run the command again to see it"
        if appending
        else ""
    )
    if len(unreadable) > int(appending):
        hint += ("; " if hint else "") + (
            "a damaged line was skipped: the bot keeps it aside beside the log at its next start"
        )
    log.warning("memory_item_lines_skipped", path=str(path), lines=where, hint=hint)


def rewrite_if_unchanged(root: Path, path: Path, lines: int, items: list[MemoryItem]) -> bool:
    """Replace a log with ``items`` unless someone appended to it; the snapshot (which marks where this
    log ended) is voided first, since the new file may even get the old one's inode number."""
    try:
        on_disk = item_snapshot.count_lines(path.read_bytes())
    except FileNotFoundError:
        on_disk = 0
    if on_disk != lines:
        return False
    item_snapshot.remove(root)
    atomic_write_text(path, "".join(line_of(i) + "\n" for i in items))
    return True
