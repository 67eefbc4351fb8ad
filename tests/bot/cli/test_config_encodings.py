"""The operator's files as editors save them: a byte-order mark is read past, another encoding than
UTF-8 is one clear line naming the file, never a traceback (run as a real subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bot.cli.membot_process import run_membot as membot

BOM = b"\xef\xbb\xbf"


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path), "MEMBOT_WORKSPACE": str(tmp_path / "ws"), "COLUMNS": "200"}


def tiny_catalog() -> bytes:
    entry = {"id": "tiny", "provider": "openai", "max_input_tokens": 2000, "max_output_tokens": 500}
    return json.dumps({"models": [entry]}).encode()


def test_a_config_file_and_models_file_saved_with_a_byte_order_mark_are_read(
    home: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "models.json").write_bytes(BOM + tiny_catalog())
    toml = tmp_path / "membot.toml"
    toml.write_bytes(BOM + f'models_file = "{tmp_path / "models.json"}"\n[llm]\nmodel = "tiny"\n'.encode())
    result = membot("--config", str(toml), "config", env=home, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "tiny" in result.stdout
    result = membot("--config", str(toml), "models", env=home, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "tiny *" in result.stdout


@pytest.mark.parametrize("command", ["config", "models", "chat"])
def test_files_not_in_utf8_are_one_clear_line(home: dict[str, str], tmp_path: Path, command: str) -> None:
    env = {**home, "MEMBOT_LLM__OPENAI__API_KEY": "sk-x"}
    toml = tmp_path / "membot.toml"
    toml.write_bytes('[llm]\nmodel = "gpt-4.1"\n# café\n'.encode("latin-1"))
    result = membot("--config", str(toml), command, env=env, cwd=tmp_path)
    assert result.returncode == 78 and "Traceback" not in result.stderr + result.stdout
    assert f"the config file {toml} is not UTF-8 text (line 3 has the byte 0xe9)" in result.stderr

    models = tmp_path / "models.json"
    models.write_bytes(tiny_catalog().replace(b'"tiny"', '"tiny café"'.encode("latin-1")))
    env["MEMBOT_MODELS_FILE"] = str(models)
    result = membot(command, env=env, cwd=tmp_path)
    if command == "config":  # `membot config` shows the settings; the catalog is not read
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 78 and "Traceback" not in result.stderr + result.stdout
    assert f"models_file {models} is not UTF-8 text (line 1 has the byte 0xe9)" in result.stderr


def test_a_dotenv_not_in_utf8_is_named(home: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / ".env").write_bytes("MEMBOT_TIMEZONE=Europe/Berlin\n# café\n".encode("latin-1"))
    result = membot("config", env=home, cwd=tmp_path)
    assert result.returncode == 78 and "Traceback" not in result.stderr
    assert ".env is not UTF-8 text (the byte 0xe9): save it as UTF-8" in result.stderr


def test_a_string_where_a_table_belongs_stops_the_start_beside_a_variable_of_that_table(
    home: dict[str, str], tmp_path: Path
) -> None:
    toml = tmp_path / "membot.toml"
    toml.write_text('llm = "gpt-4.1"\n')
    env = {**home, "MEMBOT_LLM__OPENAI__API_KEY": "sk-x"}
    result = membot("--config", str(toml), "config", env=env, cwd=tmp_path)
    assert result.returncode == 78 and "Traceback" not in result.stderr + result.stdout
    assert f"`llm` in {toml} is a string where a table belongs: write [llm]" in result.stderr
