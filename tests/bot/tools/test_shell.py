"""The shell tool: allow-listed programs only, no shell, sandboxed to the workspace, bounded, killed on stop.

The escapes an outside tester found each have a test here: glued options (``date -f/etc/passwd``,
``date -f<ws>/.env``), symbolic links inside the workspace, and the bot's state (sessions, inbox,
pairing) read or written through an allowed program.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.config import ToolSettings
from bot.tools import ToolContext, ToolError, ToolRegistry, builtin_tools
from bot.tools.files import FilesTool
from bot.tools.shell import SANDBOX_PATH, ShellTool

CTX = ToolContext("test:chat", "test", "turn1")
API_KEY = "sk-live-0123456789abcdef"
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (.ci/run installs it)"
)
pytestmark = needs_bwrap


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("alpha\nTODO: beta\ngamma\n")
    (root / ".env").write_text(f"MEMBOT_LLM__OPENAI__API_KEY={API_KEY}\n")
    (root / "sessions").mkdir()
    (root / "sessions" / "telegram%3A42.json").write_text('{"text": "the other chat\'s secret"}\n')
    (root / "inbox").mkdir()
    (root / "inbox" / "0001.json").write_text('{"text": "queued secret"}\n')
    (root / "pairing.json").write_text('{"version": 1, "pending": [], "approved": []}\n')
    (root / "memory" / "archive").mkdir(parents=True)
    (root / "memory" / "archive" / "x.jsonl").write_text("archived secret\n")
    (root / "memory" / "MEMORY.md").write_text("- likes tea\n")
    (root / "drafts").mkdir()
    (tmp_path / "outside.txt").write_text("outside secret\n")
    return root.resolve()


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
    # bwrap itself is the sandbox's PID 1 and its environment is readable there: it has none to give.
    init = await shell(workspace).run({"command": "cat /proc/1/environ"}, CTX)
    assert "sk-secret" not in init and "MEMBOT_" not in init


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("rm -rf notes.txt", "'rm' is not allowed"),
        ("/bin/cat notes.txt", "is not allowed"),
        ("bash -c 'cat notes.txt'", "'bash' is not allowed"),
        ("cat 'unclosed", "could not parse"),
        ("   ", "empty"),
    ],
)
async def test_refusals(workspace: Path, command: str, reason: str) -> None:
    assert reason in await refused(shell(workspace), command)


def escapes(ws: Path) -> list[str]:
    return [
        "date -f/etc/passwd",  # a path glued to a short option
        f"date -f{ws}/.env",  # ... to a secret inside the workspace
        "date --file=/etc/passwd",
        "grep -r root /etc",
        "grep --file=/etc/passwd notes.txt",
        "cat /etc/passwd",
        f"cat {ws.parent}/outside.txt",
        "cat ../outside.txt",
        "cat .env",
        f"cat {ws}/.env",
        "cat sessions/telegram%3A42.json",  # one chat reading another's conversation
        "cat inbox/0001.json",
        "cat pairing.json",
        "cat memory/archive/x.jsonl",
        "grep -r secret .",
        "grep -rs secret .. ../..",
        "ls -la / ..",
        "ls -la . sessions inbox memory",
        "cat links/passwd links/env links/chat/telegram%3A42.json links/up/outside.txt",
        "cat /proc/1/environ",
    ]


async def test_every_escape_the_tester_found_sees_nothing(workspace: Path) -> None:
    links = workspace / "links"
    links.mkdir()
    (links / "passwd").symlink_to("/etc/passwd")
    (links / "env").symlink_to(workspace / ".env")
    (links / "chat").symlink_to("../sessions")
    (links / "up").symlink_to("../..")
    tool = shell(workspace, allow=["cat", "date", "grep", "ls"])
    for command in escapes(workspace):
        result = await tool.run({"command": command}, CTX)
        contents = (
            "root:x:0:0",
            API_KEY,
            "chat's secret",
            "queued secret",
            "archived secret",
            "outside secret",
        )
        for secret in (*contents, '"approved"'):
            assert secret not in result, (command, result)
        for name in ("telegram%3A42", "0001.json", "x.jsonl"):  # nor even the names of what they hold
            assert name in command or name not in result, (command, result)
    # What the model may see is still there.
    assert "TODO: beta" in await tool.run({"command": "grep -r TODO ."}, CTX)
    listing = await tool.run({"command": "ls -a . memory"}, CTX)
    assert "notes.txt" in listing and "MEMORY.md" in listing and "drafts" in listing


async def test_the_bots_state_and_memory_cannot_be_written(workspace: Path) -> None:
    tool = shell(workspace, allow=["touch", "cp", "mkdir"])
    for command in (
        "touch pairing.json",
        "cp notes.txt pairing.json",
        "touch usage.json",
        "mkdir state",
        "touch memory/MEMORY.md",
        "cp notes.txt memory/MEMORY.md",
        "touch sessions/new.json",
        "touch new-at-the-top.txt",
    ):
        result = await tool.run({"command": command}, CTX)
        assert "Exit code: 0" not in result, command
    assert (workspace / "pairing.json").read_text() == '{"version": 1, "pending": [], "approved": []}\n'
    assert (workspace / "memory" / "MEMORY.md").read_text() == "- likes tea\n"
    assert sorted(await asyncio.to_thread(os.listdir, workspace)) == [
        ".env", "drafts", "inbox", "memory", "notes.txt", "pairing.json", "sessions"
    ]  # fmt: skip
    assert await asyncio.to_thread(os.listdir, workspace / "sessions") == ["telegram%3A42.json"]
    # The model's own folders stay writable.
    assert "Exit code: 0" in await tool.run({"command": "cp notes.txt drafts/copy.txt"}, CTX)
    assert (workspace / "drafts" / "copy.txt").read_text() == (workspace / "notes.txt").read_text()


async def test_the_memorys_own_records_are_not_in_the_sandbox(workspace: Path) -> None:
    """pending/ holds every chat's retiring messages (as the archive does), items/ and vectors/ are the
    memory's stores, and a hidden lock there could be held to stall its writes: none is in the sandbox."""
    memory = workspace / "memory"
    (memory / "pending").mkdir()
    (memory / "pending" / "20260101T100000000000-a1.json").write_text('{"text": "pending secret"}')
    (memory / "items" / "episodic").mkdir(parents=True)
    (memory / "items" / "episodic" / "2026-01-01.jsonl").write_text('{"content": "item secret"}\n')
    (memory / ".MEMORY.md.lock").write_text("")
    tool = shell(workspace, allow=["cat", "grep", "ls"])
    for command in ("grep -r secret memory", "cat memory/items/episodic/2026-01-01.jsonl", "ls -a memory"):
        result = await tool.run({"command": command}, CTX)
        assert "pending secret" not in result and "item secret" not in result, (command, result)
        assert "20260101T" not in result and ".MEMORY.md.lock" not in result, (command, result)
    assert "MEMORY.md" in await tool.run({"command": "ls memory"}, CTX)


async def test_links_made_in_the_sandbox_lead_the_files_tool_nowhere(workspace: Path) -> None:
    """A link made in the sandbox is a real link outside it, where ``../sessions`` does exist: the files
    tool must refuse it. A hard link to a file of the bot cannot be made at all (it is not there, and
    memory/ is another mount)."""
    tool = shell(workspace, allow=["ln"])
    await tool.run({"command": "ln -s ../sessions drafts/chats"}, CTX)
    await tool.run({"command": "ln -s ../.env drafts/env"}, CTX)
    for command in ("ln pairing.json drafts/p", "ln memory/MEMORY.md drafts/m", "ln .env drafts/e"):
        assert "Exit code: 0" not in await tool.run({"command": command}, CTX), command
    assert sorted(await asyncio.to_thread(os.listdir, workspace / "drafts")) == ["chats", "env"]

    files = FilesTool(workspace, max_bytes=10_000)
    for path in ("drafts/chats/telegram%3A42.json", "drafts/env"):
        with pytest.raises(ToolError, match="internal state"):
            await files.run({"action": "read", "path": path}, CTX)


@pytest.mark.skipif(shutil.which("python3", path=SANDBOX_PATH) is None, reason="needs python3")
async def test_no_network_in_the_sandbox(workspace: Path) -> None:
    """Not even the machine's own loopback, where the bot's ops port and a local model server listen."""
    seen: list[str] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append("connection")
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = f"import socket; print(socket.create_connection(('127.0.0.1', {port}), timeout=2))"
    try:
        result = await shell(workspace, allow=["python3"]).run({"command": f'python3 -c "{probe}"'}, CTX)
    finally:
        server.close()
        await server.wait_closed()
    assert "Exit code: 1" in result and "ConnectionRefusedError" in result, result
    assert seen == []


async def test_chat_scope_hides_memory_from_the_shell_too(workspace: Path) -> None:
    tool = shell(workspace, protected=["memory"])
    assert "likes tea" not in await tool.run({"command": "cat memory/MEMORY.md"}, CTX)
    assert "notes.txt" in await tool.run({"command": "ls"}, CTX)


async def test_a_protected_file_in_a_folder_is_hidden_in_any_case_as_the_files_tool_refuses_it(
    workspace: Path,
) -> None:
    """The operator's config kept in a folder, named in another case than the folder has on the disk
    (``--config Conf/membot.toml`` on a case-folding filesystem, where it is ``conf/membot.toml``):
    the files tool compares names without case and refuses it, and so must the sandbox."""
    (workspace / "conf").mkdir()
    (workspace / "conf" / "membot.toml").write_text('token = "bot-token-secret"\n')
    (workspace / "conf" / "readme.txt").write_text("the model's own\n")
    files = FilesTool(workspace, max_bytes=10_000, protected=["Conf/membot.toml"])
    with pytest.raises(ToolError, match="internal state"):
        await files.run({"action": "read", "path": "conf/membot.toml"}, CTX)

    tool = shell(workspace, protected=["Conf/membot.toml"])
    assert "bot-token-secret" not in await tool.run({"command": "cat conf/membot.toml"}, CTX)
    assert "the model's own" in await tool.run({"command": "cat conf/readme.txt"}, CTX)


@pytest.mark.parametrize("sandbox", ["definitely-not-bwrap-xyz", "false"])
async def test_without_a_working_sandbox_nothing_runs(workspace: Path, sandbox: str) -> None:
    reason = await refused(shell(workspace, sandbox=sandbox), "cat notes.txt")
    assert reason.startswith("no command was run")
    assert ("apt-get install bubblewrap" if sandbox != "false" else "cannot start here") in reason


async def test_allowed_but_missing_program(workspace: Path) -> None:
    tool = shell(workspace, allow=["definitely-not-installed-xyz"])
    assert "not installed" in await refused(tool, "definitely-not-installed-xyz")


async def test_output_is_capped(workspace: Path) -> None:
    (workspace / "big.txt").write_text("line\n" * 10_000)
    result = await shell(workspace, max_output=100).run({"command": "cat big.txt"}, CTX)
    assert "[output cut at 100 bytes]" in result
    assert result.count("line") <= 21


async def test_a_command_cannot_take_the_machines_memory(workspace: Path) -> None:
    """``tail /dev/zero`` keeps one endless line in memory: it took gigabytes a second until the
    timeout or the OOM killer ended it. Through the registry, as the bot builds the tool."""
    settings = ToolSettings(
        shell_enabled=True, shell_allow=["cat", "tail"], shell_timeout=20, shell_max_memory_bytes=64 * 2**20
    )
    async with httpx.AsyncClient() as http:
        tools = builtin_tools(settings, workspace=workspace, timezone="UTC", http=http)
    tool = ToolRegistry(tools, settings).get("shell", "test")
    assert tool is not None
    limits = await tool.run({"command": "cat /proc/self/limits"}, CTX)
    data = re.search(r"Max data size\s+(\S+)\s+(\S+)", limits)
    assert data is not None and data.groups() == (str(64 * 2**20), str(64 * 2**20)), limits
    result = await tool.run({"command": "tail /dev/zero"}, CTX)
    assert result.startswith("Exit code: 1\n") and "memory exhausted" in result, result
    assert "Exit code: 0" in await tool.run({"command": "tail -n 1 notes.txt"}, CTX)  # the rest works


async def test_files_in_memory_are_bounded_too(workspace: Path) -> None:
    """A file in /tmp (a tmpfs) or /dev is memory no data limit counts: ``cp /dev/zero /tmp/x`` took
    half the machine's memory."""
    tool = shell(workspace, allow=["dd", "touch"], max_memory=16 * 1024 * 1024)
    filled = await tool.run({"command": "dd if=/dev/zero of=/tmp/x bs=1M count=64"}, CTX)
    assert "No space left on device" in filled and "67108864 bytes" not in filled, filled
    assert "Read-only file system" in await tool.run({"command": "touch /dev/x"}, CTX)
    assert "Exit code: 0" in await tool.run({"command": "dd if=/dev/zero of=/dev/null count=1"}, CTX)
    assert "Exit code: 0" in await tool.run({"command": "dd if=/dev/zero of=/tmp/x bs=1M count=1"}, CTX)


async def test_a_bubblewrap_that_cannot_size_tmp_runs_with_tmp_read_only(
    workspace: Path, tmp_path: Path
) -> None:
    """bubblewrap before 0.8 (Ubuntu 22.04 has 0.6) knows no ``--size``: commands still run."""
    old = tmp_path / "bwrap-0.6"
    real = shutil.which("bwrap")
    old.write_text(
        '#!/bin/sh\nfor a; do [ "$a" = --size ] && { echo "bwrap: Unknown option --size" >&2; exit 1; }; done\n'
        f'exec {real} "$@"\n'
    )
    old.chmod(0o755)
    tool = shell(workspace, allow=["dd", "cat"], sandbox=str(old))
    assert "TODO: beta" in await tool.run({"command": "cat notes.txt"}, CTX)
    assert "Read-only file system" in await tool.run({"command": "dd if=/dev/zero of=/tmp/x count=1"}, CTX)


async def test_timeout_kills_the_process(workspace: Path) -> None:
    assert "did not finish within 0.3 s" in await refused(shell(workspace, timeout=0.3), "sleep 30")


async def test_a_flood_of_output_is_stopped_at_the_timeout_too(workspace: Path) -> None:
    """``yes`` stopped mid-read left its pipe unread: the call then waited for the tool timeout."""
    async with asyncio.timeout(4):  # the shell's own 0.5 s, and a margin for a busy machine
        assert "did not finish within 0.5 s" in await refused(shell(workspace, timeout=0.5), "yes")


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
    # Killed, but a process closes its files (our pipe) before it finishes exiting: on a busy machine
    # the test could look in between and see it still running (2 of 8 full runs did).
    async with asyncio.timeout(1.0):
        while _alive(pid):
            await asyncio.sleep(0.005)


def _child_sleep_pid() -> int | None:
    """A ``sleep`` among this process's descendants (inside the sandbox it is a grandchild)."""
    parents: dict[int, int] = {}
    commands: dict[int, bytes] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                commands[int(entry)] = f.read()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
    for pid, cmd in commands.items():
        if not cmd.split(b"\x00")[0].endswith(b"sleep"):
            continue
        ancestor = parents.get(pid)
        while ancestor and ancestor != os.getpid():
            ancestor = parents.get(ancestor)
        if ancestor == os.getpid():
            return pid
    return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
