"""The ``files`` tool: read, write, append, list and search text files inside the workspace, and nowhere else.

Confinement is checked on the resolved path (symbolic links followed), so ``..``, absolute paths and
links that lead out are refused alike. The bot's own state (sessions, inbox, pairing, usage, caches,
locks: see :mod:`bot.tools.confine`) is off limits, ``memory/`` is read-only except
``memory/MEMORY.md``, whose writes go through the memory service's compare-and-swap so an operator's
concurrent edit is merged, never overwritten. Long files are read a page at a time, and a whole-file
write is refused unless the model has seen the whole file (:mod:`bot.tools.paging`).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import stat
from collections.abc import Callable, Collection
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, TypeVar

from bot.storage import FILE_MODE, atomic_write_at
from bot.tools.base import ToolContext, ToolError, string_arg, untrusted
from bot.tools.confine import MEMORY_FILE, READ_ONLY, Confinement, is_memory_file, relative_path
from bot.tools.paging import CUT_MARKER, PAGE_NOTE, ReadLog, footer, page_of

DEFAULT_PROTECTED: tuple[str, ...] = ()  # the bot's own state is always protected (bot.tools.confine)
DEFAULT_READ_ONLY = READ_ONLY
DEFAULT_PAGE_CHARS = 12_000
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


class FilesTool:
    """Text files in the workspace for the model: notes, drafts, lists it keeps between conversations.

    ``protected`` (paths relative to the workspace) cannot be read, listed or written, in addition to
    the bot's own state, which never can; ``read_only`` can be read but not written. Files larger than
    ``max_bytes`` are refused; reads come in pages of at most ``page_chars`` characters (keep it under
    the tool loop's ``result_max_chars`` so no page is ever cut).
    """

    name = "files"
    description = (
        "Read, write, append, list and search text files in your workspace folder. Paths are relative to "
        "the workspace. Long files are read in pages (offset, limit). memory/MEMORY.md holds long-term "
        "facts: read all of it before writing it; to add a fact, append."
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
        self._root = root
        self._max = max_bytes
        self._page = max(200, page_chars)
        self._long_term = long_term
        self._rules = Confinement(root, protected=protected, read_only=read_only)
        self._memory_seen: dict[str, Any] = {}  # session id -> MEMORY.md snapshot that session last read
        self._reads = ReadLog()

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        action = string_arg(args, "action")
        rel = relative_path(string_arg(args, "path", default="."))
        if action == "read":
            offset, limit = _int_arg(args, "offset") or 1, _int_arg(args, "limit")
            if is_memory_file(rel) and self._long_term is not None:
                return await self._read_memory(ctx, offset, limit)
            text = await asyncio.to_thread(self._read, rel)
            return self._show(ctx, rel, text, offset, limit)
        if action in ("write", "append"):
            content = string_arg(args, "content")
            if len(content.encode("utf-8")) > self._max:
                raise ToolError(f"content is larger than the {self._max}-byte limit; write it in parts")
            _refuse_cut_views(content)
            if action == "write" and self._reads.partial(ctx.session_id, str(rel)):
                raise ToolError(_PARTIAL.format(path=rel))
            if is_memory_file(rel):
                return await self._write_memory(action, content, ctx)
            done = await asyncio.to_thread(self._write, rel, content, action == "append")
            if action == "write":  # the model knows all of what it wrote; an append changes nothing seen
                self._reads.forget(ctx.session_id, str(rel))
            return done
        if action == "list":
            return await asyncio.to_thread(self._list, rel)
        if action == "search":
            query = string_arg(args, "query")
            if not query.strip():
                raise ToolError("query must not be empty")
            return await asyncio.to_thread(self._search, rel, query)
        raise ToolError(f"unknown action {action!r}; use read, write, append, list or search")

    def _show(self, ctx: ToolContext, rel: PurePosixPath, text: str, offset: int, limit: int | None) -> str:
        """One page of ``text`` for the model, noting what it has now seen of this version."""
        page = page_of(text, offset=offset, limit=limit, max_chars=self._page)
        self._reads.saw(ctx.session_id, str(rel), _digest(text), page)
        note = footer(page)
        return untrusted(f"file {rel}", page.text) + (f"\n{note}" if note else "")

    def _locate(self, rel: PurePosixPath) -> Path:
        return self._rules.locate(rel)

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
        data = self._bytes_of(real, rel)
        if len(data) > self._max:
            raise ToolError(f"{rel} is over the {self._max}-byte read limit")
        if b"\x00" in data[:8192]:
            raise ToolError(f"{rel} looks like a binary file; only text files can be read")
        return data.decode("utf-8", errors="replace")

    def _bytes_of(self, real: Path, rel: PurePosixPath) -> bytes:
        """The file's bytes (up to one past the read limit), opened from its folder's descriptor and never
        through a link: the checks before looked at names, and a file or folder swapped for a link since
        (``ln``/``mv`` in the shell tool, racing the call) must fail here, not lead into the bot's state."""
        folder = self._rules.open_folder(real.parent, rel)
        try:
            fd = os.open(real.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        except OSError as exc:
            raise ToolError(f"{rel} changed while it was read ({exc.strerror}); refused") from None
        finally:
            os.close(folder)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # swapped since the check
                raise ToolError(f"{rel} is not a regular file; refused")
            return f.read(self._max + 1)

    def _write(self, rel: PurePosixPath, content: str, append: bool) -> str:
        if rel == PurePosixPath("."):
            raise ToolError("give a file path to write to")
        real, root = self._locate(rel), self._root.resolve()
        if self._rules.read_only(self._rules.inner(real)):
            raise ToolError(f"{rel} is maintained by the bot's memory and is read-only here")
        if real.exists() or real.is_symlink():
            mode = os.lstat(real).st_mode
            if not stat.S_ISREG(mode):
                raise ToolError(f"{rel} exists and is not a regular file; refused")
        if not real.is_relative_to(root):
            raise ToolError(f"{rel} leads outside the workspace; refused")
        folder = self._rules.open_folder(real.parent, rel, create=True)
        try:
            if append:
                size = self._append(folder, real.name, rel, content.encode("utf-8"))
                return f"Appended {len(content)} characters to {rel} (now {size} bytes)."
            atomic_write_at(folder, real.name, content.encode("utf-8"))
        except OSError as exc:
            raise ToolError(f"could not write {rel}: {exc.strerror}") from None
        finally:
            os.close(folder)
        return f"Wrote {len(content)} characters to {rel}."

    def _append(self, folder: int, name: str, rel: PurePosixPath, data: bytes) -> int:
        """Append durably; a file never grows past the read limit (it could not be read back).

        The size is checked and the text written under an exclusive lock on the file: one answer's
        calls run at once, each in a worker thread (two chats may share a file too), and appends that
        all read the size before any wrote would all pass the check."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        fd = os.open(name, flags, FILE_MODE, dir_fd=folder)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ToolError(f"{rel} is not a regular file; refused")
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when the descriptor is closed
            info = os.fstat(fd)
            if info.st_size + len(data) > self._max:
                raise ToolError(
                    f"{rel} would grow past the {self._max}-byte limit of what can be read back; "
                    "start a new file"
                )
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if info.st_size == 0:  # maybe new: its name must survive a power cut too
            os.fsync(folder)
        return size

    def _list(self, rel: PurePosixPath) -> str:
        real = self._locate(rel)
        info = _stat(real, rel)
        if not stat.S_ISDIR(info.st_mode):
            raise ToolError(f"{rel} is not a folder; use action 'read'")
        lines: list[str] = []
        folder = self._rules.open_folder(real, rel)  # listed by descriptor: a link swapped in is not
        try:
            with os.scandir(folder) as found:
                entries = sorted(found, key=lambda e: e.name)
            inner = self._rules.inner(real)  # (once: it resolves the workspace's path)
            shown = [e for e in entries if not self._rules.protected(inner / e.name)]
            for entry in shown[:MAX_LIST]:
                if entry.is_symlink():
                    lines.append(f"{entry.name} (symbolic link)")
                elif entry.is_dir(follow_symlinks=False):
                    lines.append(f"{entry.name}/")
                else:
                    lines.append(f"{entry.name} ({entry.stat(follow_symlinks=False).st_size} bytes)")
        finally:
            os.close(folder)
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
            name = path.relative_to(root).as_posix()
            try:
                data = self._bytes_of(path, PurePosixPath(name))
            except (OSError, ToolError):  # gone, or swapped (for a link) since it was listed
                continue
            if len(data) > self._max or b"\x00" in data[:8192]:
                continue
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
            dirs[:] = sorted(d for d in dirs if not self._rules.protected(here / d))
            for name in sorted(files):
                if self._rules.protected(here / name):
                    continue
                path = Path(folder) / name
                try:
                    info = os.lstat(path)
                except OSError:  # gone since the folder was listed
                    continue
                if stat.S_ISREG(info.st_mode) and info.st_size <= self._max:
                    found.append(path)
                if len(found) > MAX_SCANNED:
                    return found
        return found

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
    except ValueError:
        raise ToolError(f"argument {key!r} must be a whole number") from None
    if number < 1:
        raise ToolError(f"argument {key!r} must be 1 or more")
    return number


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _stat(real: Path, rel: PurePosixPath) -> os.stat_result:
    try:
        return os.stat(real)
    except FileNotFoundError:
        raise ToolError(f"{rel} does not exist") from None
    except NotADirectoryError:
        raise ToolError(f"{rel}: a part of the path is not a folder") from None


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
