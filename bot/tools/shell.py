"""The ``shell`` tool: run one allow-listed program in the workspace, without a shell, bounded and killable.

Off unless ``tools.shell_enabled`` is set. The command line is split with :func:`shlex.split` and
executed directly (no pipes, redirection, globbing or variables), with a minimal environment (no API keys),
the workspace as working folder, a timeout and an output cap. On timeout or cancellation (``/stop``) the
whole process group is killed. Arguments that name absolute paths, ``~`` or ``..`` are refused as a second
line of defence; the first is the short allow-list of programs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
from collections.abc import Collection
from pathlib import Path, PurePosixPath
from typing import Any

from bot.tools.base import ToolContext, ToolError, string_arg, untrusted

_CHUNK = 65536
_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "One command line, e.g. 'grep -n TODO notes.md'."}
    },
    "required": ["command"],
}


class ShellTool:
    """Run ``allow``-listed programs in ``workspace``; ``max_output`` bytes are kept, the rest discarded."""

    name = "shell"
    parameters = _SCHEMA

    def __init__(
        self,
        workspace: Path,
        *,
        allow: Collection[str],
        timeout: float,
        max_output: int,
        search_path: str | None = None,
    ) -> None:
        self._workspace = workspace
        self._allow = sorted(set(allow))
        self._timeout = timeout
        self._max_output = max_output
        self._path = search_path or os.environ.get("PATH", "/usr/bin:/bin")
        self.description = (
            f"Run one command in the workspace folder. Allowed programs: {', '.join(self._allow)}. "
            "No shell features (pipes, redirection, wildcards, variables); paths stay inside the workspace."
        )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        argv = self._parse(string_arg(args, "command"))
        program = await asyncio.to_thread(shutil.which, argv[0], path=self._path)
        if program is None:
            raise ToolError(f"{argv[0]!r} is allowed but not installed on this machine")
        env = {"PATH": self._path, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": str(self._workspace)}
        process = await asyncio.create_subprocess_exec(
            program,
            *argv[1:],
            cwd=self._workspace,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group, so children die with it
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
        for arg in argv[1:]:
            for part in (arg, *arg.split("=", 1)[1:]):
                if part.startswith(("/", "~")) or ".." in PurePosixPath(part).parts:
                    raise ToolError(f"argument {arg!r} leaves the workspace; use paths relative to it")
        return argv

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
