"""MEMORY.md: long-term facts the operator owns, read fresh on change and written by compare-and-swap.

Operators edit the file with any editor while the bot runs. Every read returns the text and its content
hash; a bot write names the hash it based its change on and is refused if the file moved meanwhile, so
an operator's edit is never overwritten silently. :func:`merge_lines` re-applies the bot's change on top
of the operator's version. Before each bot write the text it replaces is appended to
``MEMORY.replaced.md`` beside it, so a consolidation that drops a fact it should have kept can be undone.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bot.storage import append_bytes, atomic_write_text

MAX_CAS_ATTEMPTS = 5
REPLACED_NAME = "MEMORY.replaced.md"


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Snapshot:
    text: str
    hash: str


class Conflict(Exception):
    """The file changed since it was read: the caller re-reads and re-merges."""


class LongTermMemory:
    """MEMORY.md with an mtime-checked cache and compare-and-swap writes.

    Usage::

        snap = await memory.read()
        await memory.write(new_text, expected=snap.hash)   # raises Conflict if someone edited it
        await memory.update(lambda text: text + "- likes tea\n")   # read-modify-write with retries
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._replaced = path.with_name(REPLACED_NAME)
        self._stamp: tuple[int, int, int] | None = None
        self._cached = Snapshot("", content_hash(""))
        self._lock = asyncio.Lock()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def replaced_path(self) -> Path:
        """Every version a bot write replaced, oldest first (append-only)."""
        return self._replaced

    async def read(self) -> Snapshot:
        """The current text; re-read from disk only when its mtime, size or inode changed."""
        return await asyncio.to_thread(self._read_sync)

    def _read_sync(self) -> Snapshot:
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            self._stamp, self._cached = None, Snapshot("", content_hash(""))
            return self._cached
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            text = self._path.read_text(encoding="utf-8", errors="replace")
            self._stamp, self._cached = stamp, Snapshot(text, content_hash(text))
        return self._cached

    async def write(self, text: str, *, expected: str) -> Snapshot:
        """Replace the file with ``text`` if it still has the content hash ``expected``."""
        async with self._lock:
            return await asyncio.to_thread(self._write_sync, text, expected)

    def _write_sync(self, text: str, expected: str) -> Snapshot:
        self._stamp = None  # never trust the cache for the check: re-read what is on disk now
        current = self._read_sync()
        if current.hash != expected:
            raise Conflict(f"{self._path.name} changed since it was read")
        if text != current.text:
            if current.text.strip():
                stamp = datetime.now(UTC).isoformat(timespec="seconds")
                block = f"## {stamp} — replaced by the bot\n\n{current.text.rstrip()}\n\n"
                append_bytes(self._replaced, block.encode("utf-8"), whole_lines=True)
            atomic_write_text(self._path, text)
        return self._read_sync()

    async def update(self, change: Callable[[str], str]) -> Snapshot:
        """Apply ``change`` to the current text with compare-and-swap, re-reading on conflict."""
        for _ in range(MAX_CAS_ATTEMPTS):
            snap = await self.read()
            try:
                return await self.write(change(snap.text), expected=snap.hash)
            except Conflict:
                continue
        raise Conflict(f"{self._path.name} kept changing; gave up after {MAX_CAS_ATTEMPTS} attempts")

    async def replace_from(self, base: Snapshot, proposed: str) -> tuple[Snapshot, bool]:
        """Write ``proposed`` (derived from ``base``); on conflict merge it into the newer text.

        Returns the snapshot written and whether a merge was needed. Lines the operator added or kept
        survive; lines the bot dropped from ``base`` are dropped; lines the bot added are appended.
        """
        try:
            return await self.write(proposed, expected=base.hash), False
        except Conflict:
            snap = await self.update(lambda theirs: merge_lines(base.text, proposed, theirs))
            return snap, True


def merge_lines(base: str, ours: str, theirs: str) -> str:
    """A line-level three-way merge that favours ``theirs`` (the operator's version)."""
    base_lines, our_lines = base.splitlines(), ours.splitlines()
    removed = set(base_lines) - set(our_lines)
    added = [line for line in our_lines if line not in set(base_lines)]
    kept = [line for line in theirs.splitlines() if line not in removed or not line.strip()]
    present = set(kept)
    merged = kept + [line for line in added if line not in present]
    return "\n".join(merged).rstrip("\n") + "\n" if merged else ""
