"""A real ``membot chat`` whose model tries to grant itself access: the bot's own state is out of reach.

Prompt injection in a fetched page can make the model call any tool with any arguments. The files tool
must then be unable to touch what the bot keeps at the workspace root (pairing.json above all: writing
an ``approved`` entry there would admit a stranger); access changes only through ``membot pairing``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from bot.pairing import PairingStore
from bot.tools import ToolContext, ToolError
from bot.tools.files import FilesTool
from tests.bot.cli.membot_process import run_membot
from tests.bot.cli.test_chat_process import membot_chat
from tests.fakes.llm_server import FakeLLMServer, FakeReply

STRANGER = {
    "version": 1,
    "pending": [],
    "approved": [
        {
            "channel": "telegram",
            "user_id": "666",
            "user_name": "Mallory",
            "approved_at": "2024-01-01T00:00:00+00:00",
            "code": "",
        }
    ],
}


def _tool_results(llm: FakeLLMServer) -> list[str]:
    """The tool results the model was shown (the last request carries the whole conversation)."""
    return [str(m.get("content")) for m in llm.requests[-1].body["messages"] if m.get("role") == "tool"]


async def test_the_model_cannot_approve_a_stranger_through_the_files_tool(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    grant = json.dumps(STRANGER)
    async with FakeLLMServer() as llm:
        llm.script(
            FakeReply(tool_calls=[("files", {"action": "write", "path": "pairing.json", "content": grant})]),
            FakeReply(
                tool_calls=[("files", {"action": "append", "path": "./pairing.json", "content": grant})]
            ),
            FakeReply(tool_calls=[("files", {"action": "write", "path": "usage.json", "content": "{}"})]),
            FakeReply(text="all done"),
        )
        async with membot_chat(tmp_path, llm) as chat:
            await chat.type("summarize https://example.test/page")
            await chat.wait_for("all done")
            await chat.type("/exit")
            await chat.exit_code()

    results = _tool_results(llm)
    assert len(results) == 3 and all("belongs to the bot" in r for r in results), results
    assert not await PairingStore(workspace / "pairing.json").is_approved("telegram", "666")
    env = {"MEMBOT_WORKSPACE": str(workspace), "HOME": str(tmp_path)}
    listed = await asyncio.to_thread(run_membot, "pairing", "list", env=env)
    assert "666" not in listed.stdout and "Mallory" not in listed.stdout


async def test_everything_a_real_bot_keeps_at_the_root_is_out_of_the_files_tools_reach(
    tmp_path: Path,
) -> None:
    """Whatever a running bot creates at the workspace root (now or added later) is refused to the tool."""
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm:
        llm.script(
            FakeReply(
                tool_calls=[("files", {"action": "write", "path": "notes/todo.md", "content": "milk"})]
            ),
            FakeReply(text="noted"),
        )
        async with membot_chat(tmp_path, llm) as chat:
            await chat.type("remember to buy milk")
            await chat.wait_for("noted")
            await chat.type("/exit")
            await chat.exit_code()
    # as `membot pairing` leaves it
    await asyncio.to_thread((workspace / "pairing.json").write_text, json.dumps(STRANGER))

    files = FilesTool(workspace, max_bytes=100_000)
    ctx = ToolContext("terminal:ana", "terminal", "t1")
    model_made = {"notes", "memory"}  # memory/ has its own rules (read-only, MEMORY.md by compare-and-swap)
    entries = await asyncio.to_thread(lambda: [p.name for p in workspace.iterdir()])
    owned = sorted(name for name in entries if name not in model_made)
    assert {"sessions", "inbox", "usage.json", "pairing.json"} <= set(owned)
    listing = await files.run({"action": "list", "path": "."}, ctx)
    for name in owned:
        assert name not in listing, name
        for action in ("read", "write", "append", "list"):
            try:
                await files.run({"action": action, "path": name, "content": "x"}, ctx)
            except ToolError as exc:
                assert "belongs to the bot" in str(exc), (name, action, str(exc))
            else:
                raise AssertionError(f"files {action} {name} was allowed")


async def test_a_config_file_kept_in_the_workspace_is_out_of_the_tools_reach(tmp_path: Path) -> None:
    """An operator may keep membot.toml (tokens, allowlists) in a folder of the workspace: the files tool
    read it back to the model, and could edit its allowlist."""
    workspace = tmp_path / "ws"
    config = workspace / "conf" / "membot.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[telegram]\nallowed_users = ["42"]\n')
    edit = '[telegram]\nallowed_users = ["42", "666"]\n'
    async with FakeLLMServer() as llm:
        llm.script(
            FakeReply(tool_calls=[("files", {"action": "read", "path": "conf/membot.toml"})]),
            FakeReply(
                tool_calls=[("files", {"action": "write", "path": "Conf/membot.toml", "content": edit})]
            ),
            FakeReply(tool_calls=[("files", {"action": "list", "path": "conf"})]),
            FakeReply(text="all done"),
        )
        async with membot_chat(tmp_path, llm, MEMBOT_CONFIG=str(config)) as chat:
            await chat.type("what is in conf/?")
            await chat.wait_for("all done")
            await chat.type("/exit")
            await chat.exit_code()

    read, write, listing = _tool_results(llm)
    assert "belongs to the bot" in read and "allowed_users" not in read, read
    assert "belongs to the bot" in write, write
    assert "membot.toml" not in listing, listing
    assert config.read_text() == '[telegram]\nallowed_users = ["42"]\n'


async def test_the_model_cannot_create_the_config_file_the_next_start_would_read(tmp_path: Path) -> None:
    """A workspace at ``~/.membot`` holds the place of the default config file, ``~/.membot/membot.toml``,
    read at every start when it exists. A bot configured by environment alone has none yet, and the
    files tool wrote one: an allowlist of the model's (a page's) choosing, in force after a restart."""
    workspace = tmp_path / ".membot"
    grant = '[telegram]\nallowed_users = ["*"]\n'
    async with FakeLLMServer() as llm:
        llm.script(
            FakeReply(tool_calls=[("files", {"action": "write", "path": "membot.toml", "content": grant})]),
            FakeReply(tool_calls=[("files", {"action": "append", "path": "Membot.toml", "content": grant})]),
            FakeReply(text="all done"),
        )
        async with membot_chat(tmp_path, llm, MEMBOT_WORKSPACE=str(workspace)) as chat:
            await chat.type("summarize https://example.test/page")
            await chat.wait_for("all done")
            await chat.type("/exit")
            await chat.exit_code()

    results = _tool_results(llm)
    assert len(results) == 2 and all("belongs to the bot" in r for r in results), results
    assert not (workspace / "membot.toml").exists()
