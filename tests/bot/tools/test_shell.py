"""The shell tool: allow-listed programs only, no shell, inside the workspace, bounded, killed on stop."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from bot.tools import ToolContext, ToolError
from bot.tools.shell import ShellTool

CTX = ToolContext("test:chat", "test", "turn1")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("alpha\nTODO: beta\ngamma\n")
    return root


def shell(workspace: Path, **kwargs: Any) -> ShellTool:
    options: dict[str, Any] = {"allow": ["ls", "cat", "grep", "wc", "sleep", "yes", "env"], "timeout": 5.0}
    options.update(kwargs)
    options.setdefault("max_output", 10_000)
    return ShellTool(workspace, **options)


async def refused(tool: ShellTool, command: str) -> str:
    with pytest.raises(ToolError) as info:
        await tool.run({"command": command}, CTX)
    return str(info.value)


async def test_runs_an_allowed_program_in_the_workspace(workspace: Path) -> None:
    result = await shell(workspace).run({"command": "grep -n TODO notes.txt"}, CTX)
    assert result.startswith("Exit code: 0\n<untrusted source='output of grep'>")
    assert "2:TODO: beta" in result
    listing = await shell(workspace).run({"command": "ls"}, CTX)
    assert "notes.txt" in listing


async def test_no_shell_interpretation(workspace: Path) -> None:
    result = await shell(workspace).run({"command": "cat notes.txt; x | wc $HOME * > out.txt"}, CTX)
    assert "Exit code: 1" in result  # cat got the literal words as file names
    assert "No such file" in result
    assert "cat: '$HOME': No such file" in result and "cat: '*': No such file" in result
    assert not (workspace / "out.txt").exists()


async def test_environment_carries_no_secrets(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMBOT_LLM__OPENAI__API_KEY", "sk-secret")
    result = await shell(workspace).run({"command": "env"}, CTX)
    assert "sk-secret" not in result and f"HOME={workspace}" in result


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("rm -rf notes.txt", "'rm' is not allowed"),
        ("/bin/cat notes.txt", "is not allowed"),
        ("bash -c 'cat notes.txt'", "'bash' is not allowed"),
        ("cat /etc/passwd", "leaves the workspace"),
        ("cat ../secret", "leaves the workspace"),
        ("cat ~/.ssh/id_rsa", "leaves the workspace"),
        ("grep --file=/etc/passwd x", "leaves the workspace"),
        ("cat 'unclosed", "could not parse"),
        ("   ", "empty"),
    ],
)
async def test_refusals(workspace: Path, command: str, reason: str) -> None:
    assert reason in await refused(shell(workspace), command)


async def test_allowed_but_missing_program(workspace: Path) -> None:
    tool = shell(workspace, allow=["definitely-not-installed-xyz"])
    assert "not installed" in await refused(tool, "definitely-not-installed-xyz")


async def test_output_is_capped(workspace: Path) -> None:
    (workspace / "big.txt").write_text("line\n" * 10_000)
    result = await shell(workspace, max_output=100).run({"command": "cat big.txt"}, CTX)
    assert "[output cut at 100 bytes]" in result
    assert result.count("line") <= 21


async def test_timeout_kills_the_process(workspace: Path) -> None:
    assert "did not finish within 0.3 s" in await refused(shell(workspace, timeout=0.3), "sleep 30")


async def test_cancellation_kills_the_process_promptly(workspace: Path) -> None:
    tool = shell(workspace, timeout=60)
    task = asyncio.create_task(tool.run({"command": "sleep 30"}, CTX))
    pid = None
    async with asyncio.timeout(5):
        while pid is None:
            await asyncio.sleep(0.01)
            pid = _child_sleep_pid()
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=1.0)
    assert done and task.cancelled()
    assert not _alive(pid)


def _child_sleep_pid() -> int | None:
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if fields[1] == me and cmd.split(b"\x00")[0].endswith(b"sleep"):
            return int(entry)
    return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
