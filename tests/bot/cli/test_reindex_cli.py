"""``membot memory reindex`` as an operator runs it after changing the embedding model."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx

from bot.config import MemorySettings, Settings
from bot.memory import MemoryService, build_embedder, vector_file
from tests.bot.cli.membot_process import run_membot

EXPORT = {
    "sessions": [
        {
            "id": "s1",
            "date": "2024-01-01 10:00",
            "turns": [
                {"role": "user", "content": "I love green tea from Kyoto"},
                {"role": "assistant", "content": "Noted, green tea it is."},
            ],
        },
        {
            "id": "s2",
            "date": "2024-02-01 09:00",
            "turns": [
                {"role": "user", "content": "My dog is called Biscuit"},
                {"role": "assistant", "content": "Hi Biscuit!"},
            ],
        },
    ]
}


def membot(*args: str, workspace: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {"MEMBOT_WORKSPACE": str(workspace), "HOME": str(workspace.parent), "COLUMNS": "200"}
    env.update({f"MEMBOT_MEMORY__{k.upper()}": v for k, v in settings.items()})
    return run_membot(*args, env=env)


def imported(tmp_path: Path) -> tuple[Path, int]:
    """A workspace with EXPORT imported, and how many of its items get a vector (the bot embeds what
    the user said, not the assistant's answers)."""
    export = tmp_path / "conv.json"
    export.write_text(json.dumps(EXPORT))
    ws = tmp_path / "ws"
    result = membot("memory", "import", str(export), workspace=ws)
    assert result.returncode == 0, result.stderr
    found = re.search(r"(\d+) memory items", result.stdout)
    assert found, result.stdout
    items = stored_items(ws)
    assert len(items) == int(found.group(1))
    return ws, sum(1 for item in items if "assistant" not in item["tags"])


def stored_items(ws: Path) -> list[dict[str, Any]]:
    logs = sorted((ws / "memory" / "items").rglob("*.jsonl"))
    return [json.loads(line) for log in logs for line in log.read_text().splitlines() if line.strip()]


def test_reindex_embeds_every_item_once_with_the_bundled_model(tmp_path: Path) -> None:
    ws, items = imported(tmp_path)
    first = membot("memory", "reindex", workspace=ws, embeddings="local")
    assert first.returncode == 0, first.stderr
    assert f"embedded {items} items with all-MiniLM-L6-v2-int8-dq; {items} vectors" in first.stdout
    vectors = ws / "memory" / "vectors" / "all-MiniLM-L6-v2-int8-dq.vec"
    assert vectors.stat().st_size == 512 + items * (32 + 2 * 384)
    assert oct(vectors.stat().st_mode & 0o777) == "0o600"

    again = membot("memory", "reindex", workspace=ws, embeddings="local")
    assert (
        again.returncode == 0
        and f"embedded 0 items with all-MiniLM-L6-v2-int8-dq; {items} vectors" in again.stdout
    )

    full = membot("memory", "reindex", "--full", workspace=ws, embeddings="local")
    assert full.returncode == 0 and f"embedded {items} items" in full.stdout
    assert vectors.stat().st_size == 512 + items * (32 + 2 * 384)  # rebuilt, not appended twice


def test_reindex_embeds_what_the_bot_embeds_and_a_started_bot_finds_nothing_left(tmp_path: Path) -> None:
    # The bot gives no vector to the assistant's answers (bot/memory/item_index.py, embeddable); reindex
    # embedded them too: twice the model's time, and meaning search then ranked answers the bot left out.
    ws, embeddable = imported(tmp_path)
    result = membot("memory", "reindex", workspace=ws, embeddings="local")
    assert result.returncode == 0, result.stderr
    assert f"embedded {embeddable} items" in result.stdout
    vectors = ws / "memory" / "vectors" / "all-MiniLM-L6-v2-int8-dq.vec"
    keys = set(vector_file.read(vectors, "all-MiniLM-L6-v2-int8-dq")[1].keys)
    answers = {item["fingerprint"] for item in stored_items(ws) if "assistant" in item["tags"]}
    assert len(keys) == embeddable and answers and not keys & answers

    # Settings are made before the loop runs, as the CLI does: validating the time zone reads its file.
    settings = Settings(workspace=ws, memory=MemorySettings(embeddings="local"))

    async def queued_at_start() -> int:  # what a bot started now would still embed
        async with httpx.AsyncClient() as http:
            service = MemoryService(
                settings.memory_dir, settings.memory, embedder=build_embedder(settings.memory, http)
            )
            await service.start()
            assert service.vectors is not None
            pending = service.vectors.pending
            await service.close()
        return pending

    assert asyncio.run(queued_at_start()) == 0


def test_reindex_says_what_to_set_when_embeddings_are_off(tmp_path: Path) -> None:
    result = membot("memory", "reindex", workspace=tmp_path / "ws", embeddings="none")
    assert (
        result.returncode == 78 and "memory.embeddings" in result.stderr and "Traceback" not in result.stderr
    )


def test_reindex_with_the_endpoint_down_fails_clearly_and_keeps_nothing_half_done(tmp_path: Path) -> None:
    ws, items = imported(tmp_path)
    result = membot(
        "memory", "reindex", workspace=ws, embeddings="openai", embeddings_base_url="http://127.0.0.1:9/v1"
    )
    assert result.returncode == 69 and "Traceback" not in result.stderr  # EX_UNAVAILABLE, not a usage error
    assert (
        "unreachable" in result.stderr and f"{items} of {items} items still have no vector" in result.stderr
    )


def reindex_against(tmp_path: Path, base_url: str) -> subprocess.CompletedProcess[str]:
    """``membot memory reindex`` of an imported workspace against an OpenAI-style embeddings endpoint at
    ``base_url`` (nothing listens there), with an API key set."""
    ws, _ = imported(tmp_path)
    return membot(
        "memory",
        "reindex",
        workspace=ws,
        embeddings="openai",
        embeddings_base_url=base_url,
        embeddings_api_key="sk-embed-0123456789abcdef",
    )


def test_the_endpoints_credentials_are_never_printed(tmp_path: Path) -> None:
    """A proxy's user:password in memory.embeddings_base_url (which ``membot config`` masks) was in the
    embedder's errors: ``reindex`` printed it in its error line and in a log line that no redaction
    passed through (only ``run`` and ``chat`` set one up)."""
    result = reindex_against(tmp_path, "http://bob:hunter2secret@127.0.0.1:9/v1")
    assert result.returncode == 69 and "unreachable" in result.stderr, result.stderr
    assert "http://127.0.0.1:9/v1/embeddings" in result.stderr  # still names the server to fix
    for secret in ("hunter2secret", "0123456789abcdef"):
        assert secret not in result.stdout + result.stderr


def test_what_a_command_logs_is_masked_and_kept_off_its_output(tmp_path: Path) -> None:
    """Only ``run`` and ``chat`` set up the log: other commands logged through structlog's default, to
    stdout (among the data they print) and unmasked, and their error line was not masked either."""
    result = reindex_against(tmp_path, "http://127.0.0.1:9/v1?api_key=zz-query-secret-42")
    assert result.returncode == 69 and "vectors_embedding_failed" in result.stderr, result.stderr
    assert result.stdout.strip() == ""  # the log is on stderr
    assert "zz-query-secret-42" not in result.stderr and "api_key=***" in result.stderr
