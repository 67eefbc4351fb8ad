"""A real ``membot run`` subprocess for tests: started, signalled, killed and read like an operator would.

The terminal channel reads our pipe, stderr (JSON log lines) is collected, and the model and chat
platforms are the protocol fakes on 127.0.0.1 (``tests/fakes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.sessions import JsonSessionStore
from tests.bot.cli.membot_process import limit_files
from tests.fakes.llm_server import FakeLLMServer
from tests.fakes.telegram_server import FakeTelegramServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """A running ``membot run`` whose terminal channel reads our pipe and whose stderr we collect."""

    def __init__(self, process: asyncio.subprocess.Process, admin_port: int) -> None:
        self.process = process
        self.admin_port = admin_port
        self.stderr = ""
        self._reader = asyncio.create_task(self._collect())

    async def _collect(self) -> None:
        assert self.process.stderr is not None
        async for line in self.process.stderr:
            self.stderr += line.decode("utf-8", "replace")

    def logged(self, event: str) -> bool:
        return f'"event": "{event}"' in self.stderr

    async def wait_log(self, event: str, timeout: float = 30) -> None:
        async with asyncio.timeout(timeout):
            while not self.logged(event):
                if self.process.returncode is not None:
                    raise AssertionError(f"membot exited early:\n{self.stderr}")
                await asyncio.sleep(0.05)

    async def say(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((text + "\n").encode())
        await self.process.stdin.drain()

    async def finish(self, timeout: float = 60) -> tuple[int, str]:
        async with asyncio.timeout(timeout):
            assert self.process.stdout is not None
            out = await self.process.stdout.read()
            code = await self.process.wait()
            await self._reader
        return code, out.decode("utf-8", "replace")

    async def kill(self) -> None:
        """SIGKILL: no Python code of membot runs after it (the crash every write must survive)."""
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
        await self._reader


def telegram_env(tg: FakeTelegramServer, **extra: str) -> dict[str, str]:
    """Telegram against the fake (terminal off, user 42 allowed, no paste-join wait)."""
    return {
        "MEMBOT_TERMINAL__ENABLED": "false",
        "MEMBOT_TELEGRAM__TOKEN": tg.token,
        "MEMBOT_TELEGRAM__BASE_URL": tg.base_url,
        "MEMBOT_TELEGRAM__BASE_FILE_URL": tg.base_file_url,
        "MEMBOT_TELEGRAM__ALLOWED_USERS": '["42"]',
        "MEMBOT_TELEGRAM__JOIN_WINDOW": "0",
        **extra,
    }


@contextlib.asynccontextmanager
async def membot_run(
    workspace: Path,
    llm: FakeLLMServer,
    *,
    ready: str | None = "membot_started",
    admin: bool = False,
    max_file_bytes: int | None = None,
    **env: str,
) -> AsyncIterator[Service]:
    """``membot run`` on ``workspace``; waits for the ``ready`` log event (``None``: returns at once).

    ``admin`` serves /healthz and /metrics on a free port (``service.admin_port``). Off unless asked:
    between finding a port free and the bot binding it, a test running beside may take it.
    ``max_file_bytes``: every write past that size of a file fails, as on a full disk (run_membot's)."""
    port = free_port() if admin else 0
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMBOT_")}
    clean.update(
        HOME=str(workspace.parent),
        MEMBOT_WORKSPACE=str(workspace),
        MEMBOT_LOG_FORMAT="json",
        MEMBOT_LLM__OPENAI__BASE_URL=llm.openai_base_url,
        MEMBOT_LLM__OPENAI__API_KEY="sk-test-key-123456",
        MEMBOT_TERMINAL__USER="ops",
        MEMBOT_ADMIN__ENABLED=str(admin).lower(),
        MEMBOT_ADMIN__PORT=str(port),
    )
    clean.update({"MEMBOT_TERMINAL__ENABLED": "true", **env})
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        "run",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=clean,
        cwd=workspace.parent,
        preexec_fn=None if max_file_bytes is None else lambda: limit_files(max_file_bytes),
    )
    service = Service(process, port)
    try:
        if ready is not None:
            with contextlib.suppress(AssertionError):  # exited early: the test looks at why
                await service.wait_log(ready, timeout=60)
            if "not available in this build" in service.stderr:
                pytest.skip("this channel is not wired into bot/app.py yet")
            assert process.returncode is None, service.stderr
        yield service
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def wait_in_flight(llm: FakeLLMServer, timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while llm.in_flight == 0:
            await asyncio.sleep(0.02)


def stored(workspace: Path, sid: str = "cli:ops") -> list[tuple[str, str]]:
    """The session as a fresh process would load it (proves the files are intact)."""
    session = asyncio.run(JsonSessionStore(workspace / "sessions").load(sid))
    assert session is not None
    return [(m.role.value, m.content) for m in session.messages]


def session_headers_parse(workspace: Path) -> None:
    for path in (workspace / "sessions").iterdir():
        if path.suffix == ".json":
            json.loads(path.read_text())
