"""The disk side of the ``files`` tool: read, write, append, list and search, never through a link.

Confinement (bot/tools/confine.py) is checked on the resolved path; then each file is opened from its
folder's descriptor without following links, so a file or folder swapped for a link since the check
fails instead of leading into the bot's state. A write replaces the file atomically, an append is
fsynced under an exclusive lock, and no file grows past what can be read back. Every operation here
blocks: the tool runs it in a worker thread.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path, PurePosixPath

from bot.storage import FILE_MODE, atomic_write_at
from bot.tools.base import ToolError, untrusted
from bot.tools.confine import Confinement

MAX_LIST = 200
MAX_MATCHES = 100
MAX_SCANNED = 2000
NOT_UTF8 = (
    "is not UTF-8 text (it was saved in another encoding): the characters shown as '\ufffd' could not "
    "be read, and replacing the file would turn them into that for good, so it cannot be written whole; "
    "use action 'append', or write to a new file"
)


class WorkspaceFiles:
    """The workspace's text files as the model's tools may touch them (see the module doc): inside
    ``root``, within ``rules``, none larger than ``max_bytes``. :class:`~bot.tools.files.FilesTool`
    extends it with the tool's actions, its pages and MEMORY.md."""

    def __init__(self, root: Path, rules: Confinement, max_bytes: int) -> None:
        self._root = root
        self._max = max_bytes
        self._rules = rules

    def _locate(self, rel: PurePosixPath) -> Path:
        return self._rules.locate(rel)

    # -- actions (run in a worker thread) -------------------------------------------------------------

    def _read(self, rel: PurePosixPath) -> tuple[str, bool]:
        """The file's text, and whether it is UTF-8 (if not, what could not be decoded shows as ``�``)."""
        data = self._read_bytes(rel)
        try:
            return data.decode("utf-8"), True
        except UnicodeDecodeError:
            return data.decode("utf-8", errors="replace"), False

    def _read_bytes(self, rel: PurePosixPath) -> bytes:
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
        return data

    def _replaced(self, rel: PurePosixPath) -> str | None:
        """The text a whole-file write to ``rel`` would replace; None when there is none to lose (no
        such file, an empty one, or no regular file, which the write itself refuses)."""
        real = self._locate(rel)
        if self._rules.read_only(self._rules.inner(real)):
            return None  # the write refuses it, saying why
        try:
            info = os.stat(real)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            return None
        try:
            text, utf8 = self._read(rel)
        except ToolError as exc:  # too large or binary: it cannot have been read whole
            raise ToolError(
                f"{rel} exists and cannot be replaced, since it cannot be read whole ({exc}); "
                "write to a new file instead"
            ) from None
        if not utf8:  # the model saw "�" where each accented letter was: writing that back loses them
            raise ToolError(f"{rel} {NOT_UTF8}")
        return text

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
            if not mode & stat.S_IWUSR:  # by its mode: a rename, or root, would write it all the same
                raise ToolError(f"{rel} was made read-only by the operator, so it was not changed")
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
        # O_NONBLOCK: a pipe swapped in since the check (mkfifo in the shell tool, racing the call) would
        # block the open until some reader came, forever, holding a worker thread the bot's writes need.
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(name, flags, FILE_MODE, dir_fd=folder)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a pipe nobody reads
                raise ToolError(f"{rel} is not a regular file; refused") from None
            raise
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
        # The names are anyone's text (another chat's, the shell's): data, as a file's text is.
        return untrusted(f"folder {rel}", f"{rel}/:\n" + ("\n".join(lines) if lines else "(empty)"))

    def _search(self, rel: PurePosixPath, query: str) -> str:
        real = self._locate(rel)
        _stat(real, rel)  # a folder that is not there is said so, not a crash of the walk below
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


def _stat(real: Path, rel: PurePosixPath) -> os.stat_result:
    try:
        return os.stat(real)
    except FileNotFoundError:
        raise ToolError(f"{rel} does not exist") from None
    except NotADirectoryError:
        raise ToolError(f"{rel}: a part of the path is not a folder") from None
