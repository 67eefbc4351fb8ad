"""``membot memory reindex`` as an operator runs it after changing the embedding model."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

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
    export = tmp_path / "conv.json"
    export.write_text(json.dumps(EXPORT))
    ws = tmp_path / "ws"
    result = membot("memory", "import", str(export), workspace=ws)
    assert result.returncode == 0, result.stderr
    found = re.search(r"(\d+) memory items", result.stdout)
    assert found, result.stdout
    return ws, int(found.group(1))


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


def test_reindex_says_what_to_set_when_embeddings_are_off(tmp_path: Path) -> None:
    result = membot("memory", "reindex", workspace=tmp_path / "ws", embeddings="none")
    assert (
        result.returncode == 2 and "memory.embeddings" in result.stderr and "Traceback" not in result.stderr
    )


def test_reindex_with_the_endpoint_down_fails_clearly_and_keeps_nothing_half_done(tmp_path: Path) -> None:
    ws, items = imported(tmp_path)
    result = membot(
        "memory", "reindex", workspace=ws, embeddings="openai", embeddings_base_url="http://127.0.0.1:9/v1"
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        "unreachable" in result.stderr and f"{items} of {items} items still have no vector" in result.stderr
    )
