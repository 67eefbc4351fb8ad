"""The ``shell`` tool: run one allow-listed program inside a bubblewrap sandbox that shows only the workspace.

Off unless ``tools.shell_enabled`` is set, and then only with bubblewrap (``bwrap``) installed and able
to start: without it the tool refuses every command and says how to fix that.

Why a sandbox and not argument checks: the tool used to refuse arguments that looked like paths leading
out (absolute, ``~``, ``..``), and an outside tester walked straight past it. ``date -f/etc/passwd``
glues the path to a short option, ``date -f<ws>/.env`` read the API key from inside the workspace,
symbolic links inside the workspace were followed, and ``sessions/`` and ``inbox/`` let one chat read
another's conversation. Every program parses its own options (``-f FILE``, ``-fFILE``, ``--file=FILE``,
``-nf FILE``, response files, environment variables), and an operator may allow programs whose every
argument can name a file, so no check of the command line can know all the paths a program will open.
A mount namespace does not have to know: the program simply has nothing else to open. The sandbox holds

- the system's programs and libraries read-only (``/usr``, ``/bin``, ``/lib*``, a few ``/etc`` files
  the loader and ``date`` need; not ``/etc/passwd``, not the home folder, not the bot's own files),
- the workspace at its usual path, built entry by entry from what the model may use: the bot's state
  (:mod:`bot.tools.confine`: sessions, inbox, pairing, usage, caches, locks, hidden files, the memory's
  records) is not there at all, ``memory/`` is read-only, and the top level itself is read-only so
  nothing new appears beside the bot's files (folders the model owns stay writable),
- an empty ``/tmp``, a private ``/proc`` and ``/dev``, no network, no capabilities, a new session (so
  it cannot type into the bot's terminal), and it dies with the tool.

The program's memory is capped too (``max_memory``, the data limit ``RLIMIT_DATA``, set by ``/bin/sh``
in the sandbox right before it becomes the program): ``tail /dev/zero`` keeps one endless line and
took the machine's memory at gigabytes a second until the timeout, or the kernel's OOM killer, ended
it (the bot itself a likely victim). bwrap has no option for limits, and a ``preexec_fn`` in the bot's
threaded process could deadlock the fork. A file in memory is memory too, and no data limit counts it:
``/tmp`` holds at most ``max_memory`` bytes and ``/dev`` is read-only (``cp /dev/zero /tmp/x`` filled
half the machine's memory). A bubblewrap older than 0.8 cannot size ``/tmp``: there it is read-only.

Symbolic links are harmless there: they resolve inside the sandbox, where neither the outside nor the
bot's state exists. The command line is split with :func:`shlex.split` and executed directly (no pipes,
redirection, globbing or variables) with a minimal environment (no API keys), a timeout and an output
cap. On timeout or cancellation (``/stop``) the sandbox is killed, and every process in it with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shlex
import shutil
import signal
import stat
from collections.abc import Collection
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from bot.tools.base import ToolContext, ToolError, string_arg, untrusted
from bot.tools.confine import READ_ONLY, Confinement, folded

log = structlog.get_logger(__name__)

_CHUNK = 65536
DEFAULT_MAX_MEMORY = 512 * 1024 * 1024
# Run by /bin/sh in the sandbox: cap the data segment (KiB), then become the program ($0, its words "$@").
_LIMIT = 'ulimit -d {kib} || exit 126; exec "$0" "$@"'
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives")
INSTALL_HINT = (
    "the shell tool runs commands only inside a bubblewrap sandbox; install it (Debian/Ubuntu: "
    "apt-get install bubblewrap) or set tools.shell_enabled = false"
)
_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "One command line, e.g. 'grep -n TODO notes.md'."}
    },
    "required": ["command"],
}


class ShellTool:
    """Run ``allow``-listed programs in a sandbox of ``workspace``; ``max_output`` bytes are kept, and a
    program may use at most ``max_memory`` bytes of data memory (heap and private mappings).

    ``sandbox`` is the bubblewrap executable; ``protected`` and ``read_only`` add to the workspace rules
    the files tool follows (:class:`bot.tools.confine.Confinement`).
    """

    name = "shell"
    parameters = _SCHEMA

    def __init__(
        self,
        workspace: Path,
        *,
        allow: Collection[str],
        timeout: float,
        max_output: int,
        max_memory: int = DEFAULT_MAX_MEMORY,
        search_path: str = SANDBOX_PATH,
        sandbox: str = "bwrap",
        protected: Collection[str] = (),
        read_only: Collection[str] = READ_ONLY,
    ) -> None:
        self._workspace = workspace
        self._allow = sorted(set(allow))
        self._timeout = timeout
        self._max_output = max_output
        self._max_memory = max_memory
        self._path = search_path
        self._sandbox = sandbox
        self._rules = Confinement(workspace, protected=protected, read_only=read_only)
        self._ready: str | None = None  # the bwrap that started a sandbox once; None: not checked yet
        self._sized_tmp = True  # False: this bwrap cannot size a tmpfs (before 0.8), /tmp is read-only
        self.description = (
            f"Run one command in the workspace folder. Allowed programs: {', '.join(self._allow)}. "
            "No shell features (pipes, redirection, wildcards, variables). The command sees only your "
            "workspace files (read-only at the top level and in memory/), no network."
        )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        argv = self._parse(string_arg(args, "command"))
        bwrap = await self._sandbox_ready()
        program = await asyncio.to_thread(shutil.which, argv[0], path=self._path)
        if program is None:
            raise ToolError(f"{argv[0]!r} is allowed but not installed on this machine")
        command = [bwrap, *await asyncio.to_thread(self._jail), *self._limited(program), *argv[1:]]
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group; the sandbox dies with bwrap
            env=self._env(),
        )
        try:
            async with asyncio.timeout(self._timeout) as window:
                output, cut = await self._collect(process)
                code = await process.wait()
        except TimeoutError:
            if window.expired():
                raise ToolError(
                    f"{argv[0]} did not finish within {self._timeout:g} s and was stopped"
                ) from None
            raise
        finally:
            if process.returncode is None:  # timeout or cancellation: stop it now, leave no orphan
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                # The pipe must reach its end too: a flood ("yes") stopped mid-read leaves the reader
                # paused on a full buffer, and wait() waits for the pipe as well as the process.
                assert process.stdout is not None
                with contextlib.suppress(OSError, TimeoutError):
                    async with asyncio.timeout(5):
                        while await process.stdout.read(_CHUNK):
                            pass
                await process.wait()
        text = output.decode("utf-8", errors="replace")
        if cut:
            text += f"\n[output cut at {self._max_output} bytes]"
        return f"Exit code: {code}\n" + untrusted(f"output of {argv[0]}", text)

    def _parse(self, command: str) -> list[str]:
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise ToolError(f"could not parse the command line: {exc}") from None
        if not argv:
            raise ToolError("the command is empty")
        if "/" in argv[0] or argv[0] not in self._allow:
            raise ToolError(f"{argv[0]!r} is not allowed; allowed programs: {', '.join(self._allow)}")
        return argv

    def _limited(self, program: str) -> list[str]:
        """``program`` started through ``/bin/sh``, which first caps its data memory (see the module doc).
        Never above the bot's own hard limit: ``ulimit`` could not raise it, and nothing would run."""
        limit = self._max_memory
        _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        return ["/bin/sh", "-c", _LIMIT.format(kib=max(1, limit // 1024)), program]

    # -- the sandbox ----------------------------------------------------------------------------------

    async def _sandbox_ready(self) -> str:
        """The bwrap executable, once it has been seen to start a sandbox here; else a ToolError."""
        if self._ready is not None:
            return self._ready
        bwrap = await asyncio.to_thread(shutil.which, self._sandbox)
        if bwrap is None:
            log.warning("shell_sandbox_missing", sandbox=self._sandbox, hint=INSTALL_HINT)
            raise ToolError(f"no command was run: {INSTALL_HINT}")
        said, code = await self._probe(bwrap)
        if code != 0 and b"--size" in said:  # bubblewrap before 0.8
            log.warning("shell_tmp_read_only", sandbox=bwrap, hint="bubblewrap 0.8 or later gives it a /tmp")
            self._sized_tmp = False
            said, code = await self._probe(bwrap)
        if code != 0:
            reason = said.decode("utf-8", "replace").strip().splitlines()[:1] or ["no message"]
            log.warning("shell_sandbox_unavailable", sandbox=bwrap, error=reason[0])
            raise ToolError(
                f"no command was run: the bubblewrap sandbox cannot start here ({reason[0]}); it needs "
                "user namespaces (a container or a systemd unit with RestrictNamespaces= blocks them)"
            )
        self._ready = bwrap
        return bwrap

    async def _probe(self, bwrap: str) -> tuple[bytes, int | None]:
        probe = await asyncio.create_subprocess_exec(
            bwrap,
            *await asyncio.to_thread(self._empty_jail),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self._env(),
        )
        said, _ = await probe.communicate()
        return said, probe.returncode

    def _env(self) -> dict[str, str]:
        """bwrap's own environment. ``--clearenv`` clears only the command's: bwrap runs as the
        sandbox's PID 1, whose /proc/1/environ the command can read, so the bot's secrets
        (MEMBOT_LLM__OPENAI__API_KEY, tokens) must never be in it."""
        return {"PATH": self._path, "LANG": "C.UTF-8"}

    def _base(self) -> list[str]:
        """Everything of the sandbox but the workspace (blocking: reads the root folder's links)."""
        home = str(self._workspace.resolve())
        args = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
        for key, value in (("PATH", self._path), ("LANG", "C.UTF-8"), ("LC_ALL", "C.UTF-8"), ("HOME", home)):
            args += ["--setenv", key, value]
        args += ["--ro-bind", "/usr", "/usr"]
        for folder in _SYSTEM_DIRS:
            if os.path.islink(folder):
                args += ["--symlink", os.readlink(folder), folder]
            elif os.path.isdir(folder):
                args += ["--ro-bind", folder, folder]
        for name in _SYSTEM_FILES:
            args += ["--ro-bind-try", name, name]
        args += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]  # (its devices stay writable)
        return [*args, *(("--size", str(self._max_memory)) if self._sized_tmp else ()), "--tmpfs", "/tmp"]

    def _end(self) -> list[str]:
        """The last of the sandbox, after the workspace (whose folders a workspace in /tmp needs)."""
        return [] if self._sized_tmp else ["--remount-ro", "/tmp"]

    def _empty_jail(self) -> list[str]:
        """A sandbox like the real one around an empty workspace, running ``true``: does bwrap work?"""
        true = shutil.which("true", path=self._path) or "/bin/true"
        return [*self._base(), "--tmpfs", str(self._workspace.resolve()), *self._end(), "--", true]

    def _jail(self) -> list[str]:
        """The bwrap arguments: the system, then the workspace as the model may see it, then ``--``."""
        root = self._workspace.resolve()
        jail = [*self._base(), *self._folder(root, PurePosixPath(".")), *self._end()]
        return [*jail, "--chdir", str(root), "--"]

    def _folder(self, real: Path, rel: PurePosixPath) -> list[str]:
        """An empty read-only folder with each entry the model may use mounted into it."""
        args = ["--tmpfs", str(real)]
        with os.scandir(real) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                args += self._entry(Path(entry.path), rel / entry.name)
        return [*args, "--remount-ro", str(real)]

    def _entry(self, real: Path, rel: PurePosixPath) -> list[str]:
        if self._rules.protected(rel):
            return []
        try:
            info = os.lstat(real)
        except FileNotFoundError:
            return []
        if stat.S_ISLNK(info.st_mode):  # resolved inside the sandbox, where only this view exists
            return ["--symlink", os.readlink(real), str(real)]
        if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
            return []
        if stat.S_ISDIR(info.st_mode) and self._holds_protected(rel):
            return self._folder(real, rel)
        bind = "--ro-bind-try" if self._rules.read_only(rel) else "--bind-try"
        return [bind, str(real), str(real)]

    def _holds_protected(self, rel: PurePosixPath) -> bool:
        """True when something below ``rel`` is protected (``memory/archive``): mount it entry by entry.
        Without case, as :meth:`Confinement.protected` compares (``Conf/membot.toml`` is in ``conf``)."""
        parts = folded(rel).parts
        return any(
            len(p.parts) > len(parts) and folded(p).parts[: len(parts)] == parts
            for p in self._rules.protected_prefixes
        )

    async def _collect(self, process: asyncio.subprocess.Process) -> tuple[bytes, bool]:
        """Read all output, keeping the first ``max_output`` bytes; draining the rest unblocks the child."""
        assert process.stdout is not None
        kept = bytearray()
        cut = False
        while chunk := await process.stdout.read(_CHUNK):
            room = self._max_output - len(kept)
            if len(chunk) > room:
                cut = True
            kept += chunk[: max(0, room)]
        return bytes(kept), cut
