"""``membot run`` looks at the model endpoint once it is ready: a real subprocess against the fake."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from tests.bot.membot_service import Service, membot_run
from tests.fakes.llm_server import FakeLLMServer


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_lines(service: Service) -> list[dict[str, Any]]:
    return [json.loads(line) for line in service.stderr.splitlines() if line.startswith("{")]


def the(event: str, service: Service) -> dict[str, Any]:
    lines = [line for line in log_lines(service) if line["event"] == event]
    assert len(lines) == 1, service.stderr
    return lines[0]


def after_ready(event: str, service: Service) -> bool:
    events = [line["event"] for line in log_lines(service)]
    return events.index("membot_started") < events.index(event)


async def test_a_model_endpoint_that_is_down_is_a_warning_with_the_setting_to_check(tmp_path: Path) -> None:
    """A down endpoint was found by the first message (a user's) and not at the start."""
    down = f"http://127.0.0.1:{closed_port()}/v1"
    async with (
        FakeLLMServer() as llm,
        membot_run(tmp_path / "ws", llm, MEMBOT_LLM__OPENAI__BASE_URL=down) as service,
    ):
        await service.wait_log("llm_check_failed")
    line = the("llm_check_failed", service)
    assert line["level"] == "warning" and line["endpoint"] == "llm openai", line
    assert f"{down}/models: cannot connect" in line["error"], line
    assert "MEMBOT_LLM__OPENAI__BASE_URL" in line["hint"], line
    assert after_ready("llm_check_failed", service)


async def test_a_refused_key_is_a_warning_naming_the_key_setting(tmp_path: Path) -> None:
    async with (
        FakeLLMServer(openai_api_key="sk-the-right-key-987654") as llm,
        membot_run(tmp_path / "ws", llm) as service,
    ):
        await service.wait_log("llm_check_failed")
    line = the("llm_check_failed", service)
    assert "HTTP 401" in line["error"] and "MEMBOT_LLM__OPENAI__API_KEY" in line["hint"], line
    assert "sk-test-key-123456" not in service.stderr and "sk-the-right-key" not in service.stderr


async def test_a_model_endpoint_that_answers_is_logged_once_and_no_warning(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm, membot_run(tmp_path / "ws", llm) as service:
        await service.wait_log("llm_checked")
    line = the("llm_checked", service)
    assert line["level"] == "info" and line["status"] == "pass" and "gpt-4.1-mini" in line["detail"]
    assert not service.logged("llm_check_failed") and after_ready("llm_checked", service)
