"""The transcript archive: every message that leaves an active session, append-only, per session.

Location: ``memory/archive/<encoded session id>.jsonl`` (the session id is encoded as in
bot/session_names.py, so it cannot escape the folder). It lives under ``memory/`` because memory decides
when messages retire (consolidation, compaction, /new), and because the operator backs up one folder
to keep everything the bot knows. Each line: ``{"archived_at", "session_id", "message"}``. Lines are
never rewritten; a damaged one costs only itself, and a last record a kill cut short is kept aside and
cut at the next append (see :func:`_append`). A message is archived once: one a kill left in its
session after its append is found among the last records and skipped (:meth:`TranscriptArchive.append`).

:func:`search_archive` finds exact words in it (the memory tool's ``search_archive``): retrieval ranks
memories, but a line of a pasted log is best found verbatim.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from bot import damaged
from bot.domain import Message
from bot.session_names import encode_id
from bot.storage import append_bytes

ARCHIVED = "archived"  # Message.meta flag: this message is already in the archive
TAIL_BLOCK = 64 * 1024  # bytes read at a time, from the end back, to find where a cut-short record starts


class TranscriptArchive:
    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._lock = asyncio.Lock()

    @property
    def directory(self) -> Path:
        return self._dir

    def path_for(self, session_id: str) -> Path:
        return self._dir / f"{encode_id(session_id)}.jsonl"

    async def append(
        self,
        session_id: str,
        messages: Sequence[Message],
        now: datetime,
        *,
        look_in: Literal["tail", "file"] | None = "tail",
    ) -> int:
        """Archive the messages not archived yet; mark them so a second retirement skips them.

        ``look_in`` is where the file is searched for those archived before: among its last records,
        in the whole file (a resumed retirement, which later ones of the chat may have followed), or
        nowhere (None: the caller took them from :meth:`unarchived` just now)."""
        async with self._lock:
            if look_in is None:
                fresh = [m for m in messages if not m.meta.get(ARCHIVED)]
            else:
                fresh = await self._unarchived(session_id, messages, whole_file=look_in == "file")
            if not fresh:
                return 0
            stamp = now.isoformat()
            payload = "".join(
                json.dumps(
                    {"archived_at": stamp, "session_id": session_id, "message": m.to_dict()},
                    ensure_ascii=False,
                )
                + "\n"
                for m in fresh
            ).encode("utf-8")
            await asyncio.to_thread(_append, self.path_for(session_id), payload)
        for message in fresh:
            message.meta[ARCHIVED] = True
        return len(fresh)

    async def unarchived(self, session_id: str, messages: Sequence[Message]) -> list[Message]:
        """Those of ``messages`` the archive does not hold yet (the others are marked as archived)."""
        async with self._lock:
            return await self._unarchived(session_id, messages)

    async def _unarchived(
        self, session_id: str, messages: Sequence[Message], *, whole_file: bool = False
    ) -> list[Message]:
        """The ``ARCHIVED`` mark lives in the session, so a kill between an append and the session's
        save loses it while the messages stay: their ids are then among the file's last records (what
        a session still holds was archived after everything it no longer holds), and are skipped."""
        fresh = [m for m in messages if not m.meta.get(ARCHIVED)]
        if not fresh:
            return []
        count = None if whole_file else 2 * len(fresh)
        held = await asyncio.to_thread(_held, self.path_for(session_id), {m.id for m in fresh}, count)
        for message in fresh:
            if message.id in held:
                message.meta[ARCHIVED] = True
        return [m for m in fresh if m.id not in held]

    async def read(self, session_id: str) -> list[Message]:
        return await asyncio.to_thread(self._read, session_id)

    def _read(self, session_id: str) -> list[Message]:
        try:
            data = self.path_for(session_id).read_bytes()
        except FileNotFoundError:
            return []
        out: list[Message] = []
        for line in data.splitlines():
            try:  # bytes, so a damaged line (torn by a crash, bad UTF-8) costs only itself
                out.append(Message.from_dict(json.loads(line)["message"]))
            except damaged.UNREADABLE:  # never rewritten: the line stays in the file for the operator
                continue
        return out


def _append(path: Path, payload: bytes) -> None:
    """Append ``payload`` (whole lines) after cutting a record a kill left unfinished at the end.

    A kill can cut a write short where it crosses a page. The bot is the archive's only writer and ends
    every record with a newline, so an unterminated last line is always such a record; the retirement it
    belonged to did not finish, and archives its messages again. The fragment is kept aside
    (``bot/damaged.py``) and cut, instead of staying in the middle of the file for good; should keeping
    it aside fail, it stays, and ``whole_lines`` starts the new records on a line of their own.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = 0
    start = _last_line_start(path, size) if size else 0
    if start < size:
        with path.open("rb") as f:
            f.seek(start)
            fragment = f.read()
        torn = damaged.DamagedLine(start, fragment, "a record cut short (no newline at the end)")
        if damaged.keep_aside(path, [torn], event="archive_lines_set_aside") is not None:
            os.truncate(path, start)
    append_bytes(path, payload, whole_lines=True)


def _held(path: Path, ids: set[str], count: int | None) -> set[str]:
    """Those of ``ids`` among the file's last ``count`` records (None: among all of them; blocking).

    The file is read back from its end a block at a time, and the look stops once every id is found:
    they are normally the last records, and a long-lived chat's archive is never held whole."""
    found: set[str] = set()
    wanted = {i: json.dumps(i, ensure_ascii=False)[1:-1].encode() for i in ids}  # as a line spells it
    for seen, line in enumerate(_lines_from_end(path)):
        if found == ids or (count is not None and seen >= count):
            break
        if not any(spelled in line for i, spelled in wanted.items() if i not in found):
            continue  # a cheap look at the raw line before parsing it
        try:
            message_id = str(json.loads(line)["message"]["id"])
        except damaged.UNREADABLE:
            continue
        if message_id in ids:
            found.add(message_id)
    return found


def _lines_from_end(path: Path) -> Iterator[bytes]:
    """The file's lines, last first, read a block at a time (one block and one line held at once)."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return
    with f:
        begin = f.seek(0, os.SEEK_END)
        rest = b""  # the start of a line whose beginning lies in a block not read yet
        while begin > 0:
            block = min(begin, TAIL_BLOCK)
            begin -= block
            f.seek(begin)
            lines = (f.read(block) + rest).split(b"\n")
            rest = lines[0]
            yield from (line for line in reversed(lines[1:]) if line)
        if rest:
            yield rest


def _last_line_start(path: Path, size: int) -> int:
    """Where the file's unterminated last line starts, or ``size`` when it ends with a newline."""
    with path.open("rb") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return size
        end = size
        while end > 0:
            begin = max(0, end - TAIL_BLOCK)
            f.seek(begin)
            newline = f.read(end - begin).rfind(b"\n")
            if newline >= 0:
                return begin + newline + 1
            end = begin
        return 0


@dataclass(frozen=True, slots=True)
class ArchiveHit:
    """A past message whose text holds every word searched for, with the part around the first match."""

    session_id: str
    message: Message
    excerpt: str


def search_archive(
    directory: Path,
    words: Sequence[str],
    *,
    session_id: str | None = None,
    limit: int = 10,
    context: int = 300,
) -> list[ArchiveHit]:
    """Messages (newest first) holding every one of ``words``, case-insensitively; blocking (a thread).

    ``session_id`` limits the search to that chat's file; ``None`` searches every chat (the operator,
    or a workspace-wide memory). Damaged lines are skipped, as in :meth:`TranscriptArchive.read`.
    Files are read a line at a time and only the ``limit`` newest hits are kept (messages equally new:
    the first found): a common word over a long-lived archive held all of it, and every hit, at once.
    """
    needles = [w.lower() for w in words if w.strip()]
    if not needles or limit <= 0:
        return []
    if session_id is not None:
        paths = [directory / f"{encode_id(session_id)}.jsonl"]
    else:
        paths = sorted(directory.glob("*.jsonl"))
    newest: list[tuple[datetime, int, ArchiveHit]] = []  # a min-heap: the oldest, the last found, on top
    hits = (hit for path in paths for hit in _hits(path, needles, context))
    for found, hit in enumerate(hits):
        entry = (hit.message.timestamp, -found, hit)
        if len(newest) < limit:
            heapq.heappush(newest, entry)
        else:
            heapq.heappushpop(newest, entry)
    return [hit for _, _, hit in sorted(newest, reverse=True)]


def _hits(path: Path, needles: Sequence[str], context: int) -> Iterator[ArchiveHit]:
    """The messages in ``path`` whose text holds every one of ``needles`` (lowercase), in file order."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return
    with f:
        for line in f:  # bytes, so a damaged line (torn by a crash, bad UTF-8) costs only itself
            lowered = line.lower()
            if not all(n.encode() in lowered for n in needles):
                continue  # cheap pre-check on the raw line before parsing it
            try:
                entry = json.loads(line)
                message = Message.from_dict(entry["message"])
            except damaged.UNREADABLE:
                continue
            text = message.content.lower()
            if all(n in text for n in needles):
                at = text.find(needles[0])
                start, end = max(0, at - context), min(len(text), at + len(needles[0]) + context)
                excerpt = (
                    ("…" if start else "") + message.content[start:end] + ("…" if end < len(text) else "")
                )
                yield ArchiveHit(str(entry.get("session_id") or ""), message, excerpt)
