"""One process owns a workspace: a second bot is refused, read-only commands keep working beside it."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from tests.bot.cli.membot_process import run_membot
from tests.bot.membot_service import membot_run, stored
from tests.fakes.llm_server import FakeLLMServer


def env_for(workspace: Path, llm: FakeLLMServer) -> dict[str, str]:
    return {
        "MEMBOT_WORKSPACE": str(workspace),
        "HOME": str(workspace.parent),
        "MEMBOT_LLM__OPENAI__BASE_URL": llm.openai_base_url,
        "MEMBOT_LLM__OPENAI__API_KEY": "sk-test-key-123456",
        "MEMBOT_TERMINAL__USER": "ops",
        "COLUMNS": "120",
    }


async def membot(*args: str, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_membot, *args, env=env, stdin=stdin)


async def test_a_second_bot_is_refused_and_read_only_commands_work_beside_it(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    export = tmp_path / "export.json"
    export.write_text(json.dumps({"sessions": [{"id": "s", "turns": [{"role": "user", "content": "x"}]}]}))
    async with FakeLLMServer() as llm:
        env = env_for(workspace, llm)
        async with membot_run(workspace, llm) as service:
            await service.say("hello there")
            await service.wait_log("turn_finished")
            pid = service.process.pid
            second_chat, second_run, importing = await asyncio.gather(
                membot("chat", env=env, stdin="a message that must not vanish\n"),
                membot("run", env={**env, "MEMBOT_TERMINAL__ENABLED": "true"}),
                membot("memory", "import", str(export), env=env),
            )
            for refused in (second_chat, second_run, importing):
                assert refused.returncode == 75, refused.stdout + refused.stderr  # EX_TEMPFAIL: try later
                assert f"in use by another membot (pid {pid}: membot run)" in refused.stderr
                assert "Traceback" not in refused.stderr
            readers = await asyncio.gather(
                membot("sessions", "list", env=env),
                membot("sessions", "show", "cli:ops", env=env),
                membot("memory", "show", env=env),
                membot("memory", "search", "hello", env=env),
                membot("memory", "stats", env=env),
                membot("config", env=env),
                membot("doctor", "--offline", env=env),
                membot("--help", env=env),
            )
            for result in readers:
                assert result.returncode == 0, [*result.args[3:], result.stdout, result.stderr]
                assert "in use" not in result.stderr
            assert "hello there" in readers[1].stdout
            await service.kill()  # kill -9: the kernel drops the lock with the process
        assert ("user", "a message that must not vanish") not in await asyncio.to_thread(stored, workspace)
        after = await membot("chat", env=env, stdin="and now?\n")
        assert after.returncode == 0, after.stderr
        assert "echo: and now?" in after.stdout
    assert (workspace / "membot.lock").stat().st_mode & 0o777 == 0o600
