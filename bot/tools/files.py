"""The ``files`` tool: read, write, append, list and search text files inside the workspace, and nowhere else.

Confinement is checked on the resolved path (symbolic links followed), so ``..``, absolute paths and
links that lead out are refused alike. The bot's own state (sessions, inbox, pairing, usage, caches,
locks: see :mod:`bot.tools.confine`) is off limits, ``memory/`` is read-only except
``memory/MEMORY.md``, whose writes go through the memory service's compare-and-swap so an operator's
concurrent edit is merged, never overwritten. Long files are read a page at a time, and a whole-file
write is refused unless the model has seen the whole file (:mod:`bot.tools.paging`). The disk side
(links never followed, atomic writes, locked appends) is :mod:`bot.tools.workspace_files`.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Collection
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, TypeVar

from bot.tools.base import ToolContext, ToolError, string_arg, untrusted
from bot.tools.confine import MEMORY_FILE, READ_ONLY, Confinement, is_memory_file, relative_path
from bot.tools.paging import CUT_MARKER, PAGE_NOTE, ReadLog, footer, page_of
from bot.tools.workspace_files import NOT_UTF8, WorkspaceFiles

DEFAULT_PROTECTED: tuple[str, ...] = ()  # the bot's own state is always protected (bot.tools.confine)
DEFAULT_READ_ONLY = READ_ONLY
DEFAULT_PAGE_CHARS = 12_000

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["read", "write", "append", "list", "search"]},
        "path": {
            "type": "string",
            "description": "Relative to the workspace, e.g. 'notes/todo.md'; '.' is the workspace itself.",
        },
        "content": {"type": "string", "description": "Text to write or append."},
        "query": {"type": "string", "description": "Text to look for (case-insensitive), for 'search'."},
        "offset": {
            "type": "integer",
            "minimum": 1,
            "description": "For 'read': the line to start at (1 = first); long files come in pages.",
        },
        "limit": {"type": "integer", "minimum": 1, "description": "For 'read': at most this many lines."},
    },
    "required": ["action"],
}


class Snapshot(Protocol):
    """A version of MEMORY.md: its text and a content hash."""

    @property
    def text(self) -> str: ...

    @property
    def hash(self) -> str: ...


S = TypeVar("S", bound=Snapshot)


class LongTermFile(Protocol[S]):
    """The compare-and-swap surface of MEMORY.md (``bot.memory.longterm.LongTermMemory`` provides it)."""

    async def read(self) -> S: ...

    async def update(self, change: Callable[[str], str]) -> S: ...

    async def replace_from(self, base: S, proposed: str) -> tuple[S, bool]: ...


class FilesTool(WorkspaceFiles):
    """Text files in the workspace for the model: notes, drafts, lists it keeps between conversations.

    ``protected`` (paths relative to the workspace) cannot be read, listed or written, in addition to
    the bot's own state, which never can; ``read_only`` can be read but not written. Files larger than
    ``max_bytes`` are refused; reads come in pages of at most ``page_chars`` characters (keep it under
    the tool loop's ``result_max_chars`` so no page is ever cut).
    """

    name = "files"
    description = (
        "Read, write, append, list and search text files in your workspace folder. Paths are relative to "
        "the workspace. Long files are read in pages (offset, limit). To replace an existing file, read all "
        "of it first; to add to one, append. memory/MEMORY.md holds long-term facts."
    )
    parameters = _SCHEMA

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int,
        long_term: LongTermFile[Any] | None = None,
        protected: Collection[str] = DEFAULT_PROTECTED,
        read_only: Collection[str] = DEFAULT_READ_ONLY,
        page_chars: int = DEFAULT_PAGE_CHARS,
    ) -> None:
        super().__init__(root, Confinement(root, protected=protected, read_only=read_only), max_bytes)
        self._page = max(200, page_chars)
        self._long_term = long_term
        self._memory_seen: dict[str, Any] = {}  # session id -> MEMORY.md snapshot that session last read
        self._reads = ReadLog()

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        action = string_arg(args, "action")
        rel = relative_path(string_arg(args, "path", default="."))
        if action == "read":
            offset, limit = _int_arg(args, "offset") or 1, _int_arg(args, "limit")
            if is_memory_file(rel) and self._long_term is not None:
                return await self._read_memory(ctx, offset, limit)
            text, utf8 = await asyncio.to_thread(self._read, rel)
            shown = self._show(ctx, rel, text, offset, limit)
            return shown if utf8 else f"{shown}\n[note: {rel} {NOT_UTF8}]"
        if action in ("write", "append"):
            content = string_arg(args, "content")
            if len(content.encode("utf-8")) > self._max:
                raise ToolError(f"content is larger than the {self._max}-byte limit; write it in parts")
            _refuse_cut_views(content)
            if action == "write" and self._reads.partial(ctx.session_id, str(rel)):
                raise ToolError(_PARTIAL.format(path=rel))
            if is_memory_file(rel):
                return await self._write_memory(action, content, ctx)
            if action == "write":
                await self._check_replace(ctx, rel)
            done = await asyncio.to_thread(self._write, rel, content, action == "append")
            if action == "write":  # the model knows all of what it wrote: it may replace it again
                whole = page_of(content, max_chars=len(content) + 1)
                self._reads.saw(ctx.session_id, str(rel), _digest(content), whole)
            return done
        if action == "list":
            return await asyncio.to_thread(self._list, rel)
        if action == "search":
            query = string_arg(args, "query")
            if not query.strip():
                raise ToolError("query must not be empty")
            return await asyncio.to_thread(self._search, rel, query)
        raise ToolError(f"unknown action {action!r}; use read, write, append, list or search")

    async def _check_replace(self, ctx: ToolContext, rel: PurePosixPath) -> None:
        """Refuse a whole-file write over text the model has not seen: a file it never read (an
        operator's notes, another chat's list), or one edited since it read it (the edit would be lost)."""
        current = await asyncio.to_thread(self._replaced, rel)
        if current is None:
            return
        why = self._reads.unseen(ctx.session_id, str(rel), _digest(current))
        if why == "partial":
            raise ToolError(_PARTIAL.format(path=rel))
        if why is not None:
            what = "you have not read it" if why == "unread" else "it has changed since you read it"
            raise ToolError(
                f"{rel} already exists and {what}, so writing it whole would replace text you have not "
                "seen. Read it first (action 'read'), then write; or use action 'append' to add to it, "
                "or write to a new file."
            )

    def _show(self, ctx: ToolContext, rel: PurePosixPath, text: str, offset: int, limit: int | None) -> str:
        """One page of ``text`` for the model, noting what it has now seen of this version."""
        page = page_of(text, offset=offset, limit=limit, max_chars=self._page)
        self._reads.saw(ctx.session_id, str(rel), _digest(text), page)
        note = footer(page)
        return untrusted(f"file {rel}", page.text) + (f"\n{note}" if note else "")

    # -- MEMORY.md through compare-and-swap -----------------------------------------------------------

    async def _read_memory(self, ctx: ToolContext, offset: int, limit: int | None) -> str:
        assert self._long_term is not None
        snap = await self._long_term.read()
        self._remember(ctx.session_id, snap)
        page = page_of(snap.text, offset=offset, limit=limit, max_chars=self._page)
        self._reads.saw(ctx.session_id, str(MEMORY_FILE), snap.hash, page)
        note = footer(page)
        return untrusted(f"file {MEMORY_FILE}", page.text) + (f"\n{note}" if note else "")

    async def _write_memory(self, action: str, content: str, ctx: ToolContext) -> str:
        if self._long_term is None:
            if self._rules.protected(MEMORY_FILE):  # memory/ closed (chat scope): say that instead
                raise ToolError(f"{MEMORY_FILE} belongs to the bot's internal state and cannot be written")
            raise ToolError("memory/MEMORY.md cannot be written: the memory service is not running")
        sid, key = ctx.session_id, str(MEMORY_FILE)
        if action == "append":
            there = False

            def append(text: str) -> str:
                nonlocal there
                joined = _join_once(text, content)
                there = joined == text
                return joined

            snap = await self._long_term.update(append)
            if there:
                return f"Already in {MEMORY_FILE}, line for line; nothing appended."
            # The model has not seen what others wrote meanwhile: a later whole write needs a new read.
            self._memory_seen.pop(sid, None)
            self._reads.forget(sid, key)
            return f"Appended to {MEMORY_FILE} ({len(snap.text)} characters now)."
        base = self._memory_seen.get(sid)
        if base is None:
            raise ToolError(
                f"read {MEMORY_FILE} first; a write replaces what you read and is merged with edits"
            )
        snap, merged = await self._long_term.replace_from(base, content)
        if merged:  # the file now holds lines the model has not seen: it must read before replacing again
            self._memory_seen.pop(sid, None)
            self._reads.forget(sid, key)
            return (
                f"Wrote {MEMORY_FILE}. It had been edited meanwhile, so your change was merged into the "
                "newer text; read it again before replacing it again."
            )
        self._remember(sid, snap)  # exactly the model's own text: it may replace it again
        self._reads.forget(sid, key)
        return f"Wrote {MEMORY_FILE}."

    def _remember(self, session_id: str, snap: Any) -> None:
        self._memory_seen.pop(session_id, None)
        self._memory_seen[session_id] = snap
        while len(self._memory_seen) > 256:  # bounded: oldest sessions forgotten first
            self._memory_seen.pop(next(iter(self._memory_seen)))


_PARTIAL = (
    "you have read only part of {path} (it is long and came in pages), so writing the whole file "
    "would delete what you have not seen. Read the remaining pages first (action 'read' with the "
    "offset the last page named), or use action 'append' to add to it."
)


def _refuse_cut_views(content: str) -> None:
    """Content copied from a shortened view would write the cut marker and drop what was cut."""
    if CUT_MARKER.search(content) or PAGE_NOTE in content:
        raise ToolError(
            "the content contains a marker of a shortened view ('characters cut' or a page note), so it "
            "is not the whole text; read the file in pages (offset, limit) and write only complete text"
        )


def _int_arg(args: dict[str, Any], key: str) -> int | None:
    value = args.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ToolError(f"argument {key!r} must be a whole number")
    try:
        number = int(value)
    except (ValueError, OverflowError):  # (OverflowError: ``Infinity``, which Python's JSON reader accepts)
        raise ToolError(f"argument {key!r} must be a whole number") from None
    if number < 1:
        raise ToolError(f"argument {key!r} must be 1 or more")
    return number


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _join_once(text: str, addition: str) -> str:
    """``text`` with ``addition`` appended, unless its lines are there already, one after another.

    MEMORY.md is a list of facts, and a turn cut by a kill after its append is run again after the
    restart, tool calls and all: appending the same block twice would only repeat a fact."""
    block = addition.strip("\n").splitlines()
    lines = text.splitlines()
    if block and any(lines[i : i + len(block)] == block for i in range(len(lines) - len(block) + 1)):
        return text
    return _join(text, addition)


def _join(text: str, addition: str) -> str:
    if text and not text.endswith("\n"):
        text += "\n"
    return text + addition if addition.endswith("\n") else text + addition + "\n"
