"""One process owns a workspace: an advisory lock on ``<workspace>/membot.lock``.

Two processes writing one workspace lose messages: each keeps its own sessions, inbox and usage in
memory and saves over the other's work. So ``membot run``, ``membot chat`` and the commands that write
the bot's state (``memory import``, ``sessions delete``) take this lock first, and a second one stops
at once with the holder's pid and command line. Read-only commands (``sessions list|show|export``,
``memory show|search|stats``, ``config``, ``doctor``) do not take it and work beside a running bot;
``memory edit`` coordinates with the bot through MEMORY.md's own lock, and ``pairing`` through
pairing.json's.

The lock is ``fcntl.flock`` on the open file, which the kernel releases when the process ends however
it ends (``kill -9`` included), so a leftover file never blocks a start; the pid and command written
into it only serve the error message.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from bot.errors import ConfigError, InUseError
from bot.storage import FILE_MODE, ensure_private_dir

LOCK_FILE = "membot.lock"


def unusable(workspace: Path, exc: OSError) -> ConfigError:
    """The error of a workspace the disk or its permissions refuse (read-only, not ours), as every
    command says it (78): where, why, and the settings that choose another. A permission refused
    names the file too: "Permission denied" alone left the operator to search a restored workspace
    for the one file (membot.lock, logs/membot.log) the bot's user may not write."""
    why, fix = exc.strerror or str(exc), "set --workspace or MEMBOT_WORKSPACE"
    if exc.errno in (errno.EACCES, errno.EPERM) and exc.filename is not None:
        why, fix = f"{why} on {exc.filename}", f"let the user membot runs as write it, or {fix}"
    return ConfigError(f"cannot use workspace {workspace}: {why} ({fix})")


class WorkspaceLock:
    """Holds the workspace until :meth:`release` (or the process ends).

    with WorkspaceLock.hold(settings.workspace):
        ...  # the only process writing this workspace
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, workspace: Path, *, command: str | None = None) -> WorkspaceLock:
        """Take the lock, or raise InUseError naming the process that has it."""
        path = workspace / LOCK_FILE
        try:
            ensure_private_dir(workspace)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        except OSError as exc:  # read-only, not ours: every command says what `membot run` says (78)
            raise unusable(workspace, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise InUseError(
                f"workspace {workspace} is in use by another membot ({holder}). Only one process may "
                "run the bot on a workspace: stop that one first (systemctl stop membot, or /quit in "
                "its chat), or use another workspace (--workspace or MEMBOT_WORKSPACE)."
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {command or _command_line()}\n".encode(), 0)
        return cls(fd, path)

    @classmethod
    @contextlib.contextmanager
    def hold(cls, workspace: Path, *, command: str | None = None) -> Iterator[WorkspaceLock]:
        lock = cls.acquire(workspace, command=command)
        try:
            yield lock
        finally:
            lock.release()

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the last descriptor drops the flock
        self._fd = None


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    pid, _, command = text.partition(" ")
    if not pid.isdigit():
        return "pid unknown"
    return f"pid {pid}: {command}" if command else f"pid {pid}"


def _command_line() -> str:
    args = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else []
    if args and args[0] in ("__main__.py", "-m"):
        args[0] = "membot"
    return " ".join(args) or "membot"
