"""The ``files`` tool: read, write, append, list and search text files inside the workspace, and nowhere else.

Confinement is checked on the resolved path (symbolic links followed), so ``..``, absolute paths and
links that lead out are refused alike. The bot's own state (sessions, inbox, transcript archive) is off
limits, ``memory/`` is read-only except ``memory/MEMORY.md``, whose writes go through the memory
service's compare-and-swap so an operator's concurrent edit is merged, never overwritten.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable, Collection
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, TypeVar

from bot.storage import append_bytes, atomic_write_text, ensure_private_dir
from bot.tools.base import ToolContext, ToolError, string_arg, untrusted

DEFAULT_PROTECTED = ("sessions", "inbox", "memory/archive", "logs")
DEFAULT_READ_ONLY = ("memory",)
MEMORY_FILE = PurePosixPath("memory/MEMORY.md")
MAX_LIST = 200
MAX_MATCHES = 100
MAX_SCANNED = 2000

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


class FilesTool:
    """Text files in the workspace for the model: notes, drafts, lists it keeps between conversations.

    ``protected`` (paths relative to the workspace) cannot be read, listed or written; ``read_only`` can
    be read but not written. Reads and writes larger than ``max_bytes`` are refused.
    """

    name = "files"
    description = (
        "Read, write, append, list and search text files in your workspace folder. Paths are relative to "
        "the workspace. memory/MEMORY.md holds long-term facts: read it before writing it."
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
    ) -> None:
        self._root = root
        self._max = max_bytes
        self._long_term = long_term
        self._protected = [PurePosixPath(p) for p in protected]
        self._read_only = [PurePosixPath(p) for p in read_only]
        self._memory_seen: dict[str, Any] = {}  # session id -> MEMORY.md snapshot that session last read

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        action = string_arg(args, "action")
        rel = relative_path(string_arg(args, "path", default="."))
        if action == "read":
            if rel == MEMORY_FILE and self._long_term is not None:
                return await self._read_memory(ctx)
            return await asyncio.to_thread(self._read, rel)
        if action in ("write", "append"):
            content = string_arg(args, "content")
            if len(content.encode("utf-8")) > self._max:
                raise ToolError(f"content is larger than the {self._max}-byte limit; write it in parts")
            if rel == MEMORY_FILE:
                return await self._write_memory(action, content, ctx)
            return await asyncio.to_thread(self._write, rel, content, action == "append")
        if action == "list":
            return await asyncio.to_thread(self._list, rel)
        if action == "search":
            query = string_arg(args, "query")
            if not query.strip():
                raise ToolError("query must not be empty")
            return await asyncio.to_thread(self._search, rel, query)
        raise ToolError(f"unknown action {action!r}; use read, write, append, list or search")

    # -- confinement ----------------------------------------------------------------------------------

    def _locate(self, rel: PurePosixPath) -> Path:
        """The real path of ``rel`` inside the workspace, or a ToolError saying why not."""
        root = self._root.resolve()
        real = (root / rel).resolve()
        if real != root and not real.is_relative_to(root):
            raise ToolError(f"{rel} leads outside the workspace through a symbolic link; refused")
        inner = PurePosixPath(real.relative_to(root).as_posix())
        if _under(inner, self._protected) or _under(rel, self._protected):
            raise ToolError(f"{rel} belongs to the bot's internal state and cannot be used with this tool")
        return real

    # -- actions (run in a worker thread) -------------------------------------------------------------

    def _read(self, rel: PurePosixPath) -> str:
        real = self._locate(rel)
        info = _stat(real, rel)
        if stat.S_ISDIR(info.st_mode):
            raise ToolError(f"{rel} is a folder; use action 'list'")
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{rel} is not a regular file (device, pipe or socket); refused")
        if info.st_size > self._max:
            raise ToolError(
                f"{rel} is {info.st_size} bytes, over the {self._max}-byte read limit; "
                "use action 'search' to find the part you need"
            )
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # swapped since the check
                raise ToolError(f"{rel} is not a regular file; refused")
            data = f.read(self._max + 1)
        if len(data) > self._max:
            raise ToolError(f"{rel} is over the {self._max}-byte read limit")
        if b"\x00" in data[:8192]:
            raise ToolError(f"{rel} looks like a binary file; only text files can be read")
        return untrusted(f"file {rel}", data.decode("utf-8", errors="replace"))

    def _write(self, rel: PurePosixPath, content: str, append: bool) -> str:
        if rel == PurePosixPath("."):
            raise ToolError("give a file path to write to")
        real, root = self._locate(rel), self._root.resolve()
        if _under(PurePosixPath(real.relative_to(root).as_posix()), self._read_only):
            raise ToolError(f"{rel} is maintained by the bot's memory and is read-only here")
        if real.exists() or real.is_symlink():
            mode = os.lstat(real).st_mode
            if not stat.S_ISREG(mode):
                raise ToolError(f"{rel} exists and is not a regular file; refused")
        missing = [p for p in real.parents if not p.exists() and p.is_relative_to(root)]
        for folder in reversed(missing):  # one by one, so every new folder is 0700
            ensure_private_dir(folder)
        self._locate(rel)  # the folders just created must still lead inside
        if append:
            size = append_bytes(real, content.encode("utf-8"))
            return f"Appended {len(content)} characters to {rel} (now {size} bytes)."
        atomic_write_text(real, content)
        return f"Wrote {len(content)} characters to {rel}."

    def _list(self, rel: PurePosixPath) -> str:
        real = self._locate(rel)
        info = _stat(real, rel)
        if not stat.S_ISDIR(info.st_mode):
            raise ToolError(f"{rel} is not a folder; use action 'read'")
        lines: list[str] = []
        entries = sorted(os.scandir(real), key=lambda e: e.name)
        shown = [e for e in entries if not _under(rel / e.name, self._protected)]
        for entry in shown[:MAX_LIST]:
            if entry.is_symlink():
                lines.append(f"{entry.name} (symbolic link)")
            elif entry.is_dir(follow_symlinks=False):
                lines.append(f"{entry.name}/")
            else:
                lines.append(f"{entry.name} ({entry.stat(follow_symlinks=False).st_size} bytes)")
        if len(shown) > MAX_LIST:
            lines.append(f"... and {len(shown) - MAX_LIST} more")
        return f"{rel}/:\n" + ("\n".join(lines) if lines else "(empty)")

    def _search(self, rel: PurePosixPath, query: str) -> str:
        real = self._locate(rel)
        root = self._root.resolve()
        needle = query.casefold()
        matches: list[str] = []
        scanned = 0
        for path in self._text_files(real, root):
            scanned += 1
            if scanned > MAX_SCANNED or len(matches) >= MAX_MATCHES:
                break
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if b"\x00" in data[:8192]:
                continue
            name = path.relative_to(root).as_posix()
            for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
                if needle in line.casefold():
                    matches.append(f"{name}:{number}: {line.strip()[:200]}")
                    if len(matches) >= MAX_MATCHES:
                        break
        if not matches:
            return f"No matches for {query!r} under {rel}."
        more = (
            " (stopped at the first matches; narrow the path or query)" if len(matches) >= MAX_MATCHES else ""
        )
        return untrusted(f"search results under {rel}", "\n".join(matches) + more)

    def _text_files(self, real: Path, root: Path) -> list[Path]:
        """Regular files under ``real`` (links not followed, protected folders skipped, size-capped)."""
        mode = os.lstat(real).st_mode
        if stat.S_ISREG(mode):
            return [real]
        found: list[Path] = []
        for folder, dirs, files in os.walk(real, followlinks=False):
            here = PurePosixPath(Path(folder).relative_to(root).as_posix())
            dirs[:] = sorted(d for d in dirs if not _under(here / d, self._protected))
            for name in sorted(files):
                path = Path(folder) / name
                info = os.lstat(path)
                if stat.S_ISREG(info.st_mode) and info.st_size <= self._max:
                    found.append(path)
                if len(found) > MAX_SCANNED:
                    return found
        return found

    # -- MEMORY.md through compare-and-swap -----------------------------------------------------------

    async def _read_memory(self, ctx: ToolContext) -> str:
        assert self._long_term is not None
        snap = await self._long_term.read()
        self._remember(ctx.session_id, snap)
        return untrusted(f"file {MEMORY_FILE}", snap.text)

    async def _write_memory(self, action: str, content: str, ctx: ToolContext) -> str:
        if self._long_term is None:
            if _under(MEMORY_FILE, self._protected):  # memory/ closed (chat scope): say that instead
                raise ToolError(f"{MEMORY_FILE} belongs to the bot's internal state and cannot be written")
            raise ToolError("memory/MEMORY.md cannot be written: the memory service is not running")
        if action == "append":
            snap = await self._long_term.update(lambda text: _join(text, content))
            self._remember(ctx.session_id, snap)
            return f"Appended to {MEMORY_FILE} ({len(snap.text)} characters now)."
        base = self._memory_seen.get(ctx.session_id)
        if base is None:
            raise ToolError(
                f"read {MEMORY_FILE} first; a write replaces what you read and is merged with edits"
            )
        snap, merged = await self._long_term.replace_from(base, content)
        self._remember(ctx.session_id, snap)
        note = (
            " It had been edited meanwhile, so your change was merged into the newer text." if merged else ""
        )
        return f"Wrote {MEMORY_FILE}.{note}"

    def _remember(self, session_id: str, snap: Any) -> None:
        self._memory_seen.pop(session_id, None)
        self._memory_seen[session_id] = snap
        while len(self._memory_seen) > 256:  # bounded: oldest sessions forgotten first
            self._memory_seen.pop(next(iter(self._memory_seen)))


def relative_path(raw: str) -> PurePosixPath:
    """Validate a model-supplied path without touching the disk: relative, no ``..``, no NUL."""
    if "\x00" in raw:
        raise ToolError("the path contains a NUL character")
    text = raw.strip() or "."
    if text.startswith(("/", "~", "\\")) or PurePosixPath(text).is_absolute():
        raise ToolError(f"absolute paths are not allowed ({raw!r}); give a path relative to the workspace")
    path = PurePosixPath(text)
    if ".." in path.parts:
        raise ToolError(f"'..' is not allowed in paths ({raw!r}); stay inside the workspace")
    return path


def _under(path: PurePosixPath, prefixes: list[PurePosixPath]) -> bool:
    return any(path.parts[: len(p.parts)] == p.parts for p in prefixes)


def _stat(real: Path, rel: PurePosixPath) -> os.stat_result:
    try:
        return os.stat(real)
    except FileNotFoundError:
        raise ToolError(f"{rel} does not exist") from None
    except NotADirectoryError:
        raise ToolError(f"{rel}: a part of the path is not a folder") from None


def _join(text: str, addition: str) -> str:
    if text and not text.endswith("\n"):
        text += "\n"
    return text + addition if addition.endswith("\n") else text + addition + "\n"
