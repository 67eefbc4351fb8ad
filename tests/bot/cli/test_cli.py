"""The membot command line, run as a real subprocess (what an operator types)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bot.cli.membot_process import run_membot as membot


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path), "MEMBOT_WORKSPACE": str(tmp_path / "ws"), "COLUMNS": "80"}


def test_help_lists_the_commands(home: dict[str, str], tmp_path: Path) -> None:
    result = membot("--help", env=home, cwd=tmp_path)
    assert result.returncode == 0
    for command in ("run", "chat", "config", "models"):
        assert command in result.stdout


def test_chat_without_a_model_says_what_to_set(home: dict[str, str], tmp_path: Path) -> None:
    result = membot("chat", env=home, cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    for setting in (
        "MEMBOT_LLM__OPENAI__API_KEY",
        "MEMBOT_LLM__ANTHROPIC__API_KEY",
        "http://localhost:11434/v1",
    ):
        assert setting in result.stderr


def test_run_without_channels_says_what_to_set(home: dict[str, str], tmp_path: Path) -> None:
    result = membot("run", env={**home, "MEMBOT_LLM__OPENAI__API_KEY": "sk-x"}, cwd=tmp_path)
    assert result.returncode == 2
    assert "MEMBOT_TELEGRAM__TOKEN" in result.stderr and "Traceback" not in result.stderr


def test_config_masks_secrets_and_names_sources(home: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "membot.toml").write_text('[llm]\nmodel = "claude-haiku-4-5"\n')
    env = {**home, "MEMBOT_LLM__ANTHROPIC__API_KEY": "sk-ant-supersecret-123456"}
    result = membot("--config", str(tmp_path / "membot.toml"), "config", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "supersecret" not in result.stdout
    assert "********" in result.stdout and "claude-haiku-4-5" in result.stdout
    assert "membot.toml" in result.stdout and "env" in result.stdout


def test_invalid_config_is_one_clear_line(home: dict[str, str], tmp_path: Path) -> None:
    result = membot("config", env={**home, "MEMBOT_DISPATCHER__QUEUE_LIMIT": "many"}, cwd=tmp_path)
    assert result.returncode == 2
    assert "dispatcher.queue_limit" in result.stderr and "Traceback" not in result.stderr


def test_models_lists_the_catalog(home: dict[str, str], tmp_path: Path) -> None:
    result = membot("models", env=home, cwd=tmp_path)
    assert result.returncode == 0
    assert "claude-sonnet-4-5" in result.stdout and "gpt-4.1-mini *" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
