"""What each entry point imports: heavy libraries load only where they are used (start-up time, memory).

Each check runs a fresh interpreter and reads ``sys.modules`` at its end, so it is deterministic (no
timing). bench/startup.py measures what this buys.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each costs from tens to hundreds of milliseconds to import, and several MiB of memory.
HEAVY = (
    "aiohttp",  # the ops endpoints and the Telegram webhook
    "discord",
    "google.protobuf",  # the local embedding model's graph rewrite
    "httpx",
    "numpy",  # the lexical index and vectors (memory retrieval)
    "onnxruntime",  # the local embedding model
    "prometheus_client",  # /metrics
    "prompt_toolkit",  # membot chat's line editor, at a terminal only
    "pydantic",  # settings
    "selectolax",  # web_fetch's HTML parser
    "simplemma",
    "structlog",
    "telegram",
    "tiktoken",
    "tokenizers",  # the local embedding model's WordPiece
)


def loaded_after(code: str, modules: tuple[str, ...] = HEAVY) -> list[str]:
    """The ``modules`` (HEAVY) a fresh interpreter has loaded once ``code`` ran (even if it exited)."""
    probe = (
        "import atexit, json, sys\n"
        f"heavy = {modules!r}\n"
        "atexit.register(lambda: print('LOADED ' + json.dumps(sorted(set(heavy) & set(sys.modules)))))\n"
        + code
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBOT_")}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
    )
    marker = [line for line in done.stdout.splitlines() if line.startswith("LOADED ")]
    assert marker, done.stderr
    assert done.returncode == 0, done.stderr  # what a failed ``code`` left unloaded says nothing
    loaded: list[str] = json.loads(marker[-1].removeprefix("LOADED "))
    return loaded


def test_help_imports_none_of_the_heavy_libraries() -> None:
    code = "sys.argv = ['membot', '--help']\nfrom bot.cli import main\nmain()\n"
    assert loaded_after(code) == []


def test_help_is_formatted_without_a_markdown_parser() -> None:
    # typer's rich help imports rich.markdown and markdown_it: a third of `membot --help`'s time.
    code = "sys.argv = ['membot', '--help']\nfrom bot.cli import main\nmain()\n"
    assert loaded_after(code, ("markdown_it", "rich.markdown")) == []


@pytest.mark.parametrize("group", ["sessions", "memory", "pairing", "doctor", "config", "models"])
def test_subcommand_help_imports_none_of_the_heavy_libraries(group: str) -> None:
    code = f"sys.argv = ['membot', {group!r}, '--help']\nfrom bot.cli import main\nmain()\n"
    # Typer itself checks a command's parameter values with pydantic (typer/_adapters.py).
    assert [name for name in loaded_after(code) if name != "pydantic"] == []


def test_the_composition_root_imports_no_channel_or_ops_library() -> None:
    # Channel libraries load when a channel is configured, aiohttp and prometheus_client when the ops
    # endpoints are enabled, tiktoken when the token counter loads an encoding.
    loaded = loaded_after("import bot.app, bot.serve, bot.startup, bot.terminal_chat, channels\n")
    libraries = {"aiohttp", "discord", "prometheus_client", "prompt_toolkit", "telegram", "tiktoken"}
    assert not libraries & set(loaded)


def test_the_embedding_model_s_libraries_load_with_the_model() -> None:
    # onnxruntime, tokenizers and protobuf (the graph rewrite) load when the local model does, not with
    # the memory package: a bot with memory off, or embeddings from an endpoint, holds none of them.
    code = "import bot.app, bot.memory.embeddings, bot.memory.int8_graph\n"
    model = {"google.protobuf", "onnxruntime", "tokenizers"}
    assert not model & set(loaded_after(code))
    assert model <= set(loaded_after(code + "bot.memory.embeddings.OnnxEmbedder().load()\n"))


@pytest.mark.parametrize("enabled", [False, True])
def test_memory_s_read_path_loads_only_when_memory_is_on(tmp_path: Path, enabled: bool) -> None:
    # With memory off the bot still builds and starts its MemoryService (the archive, the consolidation
    # fallbacks), but not the word index, the ranking or the vectors: numpy and simplemma stay unloaded.
    overrides = {
        "workspace": str(tmp_path / "ws"),
        "memory": {"enabled": enabled, "embeddings": "none"},
        "llm": {"openai": {"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-test-key-123456"}},
    }
    code = (
        "import asyncio\n"
        "from bot.app import build_core\n"
        "from bot.config import load_settings\n"
        f"settings = load_settings(None, env_file=None, overrides={overrides!r})\n"
        "async def main():\n"
        "    async with build_core(settings) as core:\n"
        "        assert core.memory.archive is not None\n"
        "asyncio.run(main())\n"
    )
    read_path = {"numpy", "simplemma"}
    assert set(loaded_after(code, tuple(read_path))) == (read_path if enabled else set())


def test_the_tools_load_the_html_parser_only_for_a_page() -> None:
    # web_fetch is always registered, but its parser (selectolax) loads with the first page it reads.
    code = (
        "from bot.tools import html_text, web_fetch\n"
        "assert 'selectolax' not in sys.modules\n"
        "print(html_text.html_to_text('<title>t</title><p>x</p>'))\n"
    )
    assert "selectolax" in loaded_after(code)
    assert "selectolax" not in loaded_after("from bot.tools import html_text, web_fetch\nimport bot.app\n")


def test_the_telegram_channel_loads_aiohttp_only_for_webhooks() -> None:
    loaded = loaded_after("import channels.telegram\n")
    assert "telegram" in loaded
    assert not {"aiohttp", "discord", "prometheus_client"} & set(loaded)
