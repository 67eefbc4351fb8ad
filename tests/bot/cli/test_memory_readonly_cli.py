"""``membot memory search|show|stats`` run beside the bot, which owns the files: they only read."""

from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from bot.config import MemorySettings
from bot.memory import MemoryService, vector_file
from bot.memory.embeddings import OnnxEmbedder
from tests.bot.cli.membot_process import run_membot


def membot(*args: str, workspace: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"MEMBOT_WORKSPACE": str(workspace), "HOME": str(workspace.parent), "COLUMNS": "200"}
    return run_membot(*args, env={**base, **env})


TORN = b'{"id": "torn-item", "layer": "episodic", "content": "half a li'
MODEL = OnnxEmbedder.model_id  # memory.embeddings = "local", the default
TORN_VECTOR = b"a-fingerprint-being-written\0\0\0\0\0" + bytes(300)  # 332 of a record's 800 bytes


def files(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under ``root`` (folders too) with its mode and, for a file, its bytes."""
    out: dict[str, tuple[int, bytes | None]] = {}
    for folder, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            path = Path(folder) / name
            mode = path.lstat().st_mode
            out[str(path.relative_to(root))] = (mode, None if path.is_dir() else path.read_bytes())
    return out


def imports(ws: Path, name: str, sessions: list[dict[str, object]], **env: str) -> None:
    export = ws.parent / name
    export.write_text(json.dumps({"sessions": sessions}))
    imported = membot("memory", "import", str(export), workspace=ws, **env)
    assert imported.returncode == 0, imported.stderr


def bot_is_writing(tmp_path: Path, **env: str) -> tuple[Path, Path]:
    """A workspace as `membot memory search` may find it beside a running bot: an item log whose last line
    is still being appended (torn), no snapshot of the items (the bot saves it at its stop), and a
    note the operator saved with another mode; the bundled model's vectors of the items but the newest
    (not embedded yet), their file's last record still being appended (torn); returns the workspace
    and the torn log."""
    sessions = [
        {
            "id": "telegram:1",
            "date": "2024-01-01 10:00",
            "turns": [
                {"role": "user", "content": "I love green tea from Kyoto"},
                {"role": "assistant", "content": "Noted, green tea it is."},
            ],
        },
        {
            "id": "telegram:2",
            "date": "2024-01-01 11:00",
            "turns": [{"role": "user", "content": "My dog is called Biscuit"}],
        },
        {
            "id": "telegram:3",
            "date": "2024-01-01 12:00",
            "turns": [{"role": "user", "content": "I drive an old Subaru Outback"}],
        },
    ]
    ws = tmp_path / "ws"
    imports(ws, "conv.json", sessions, **env)
    embedded = membot("memory", "reindex", workspace=ws, **env)
    assert embedded.returncode == 0, embedded.stderr
    later = [
        {
            "id": "telegram:4",
            "date": "2024-01-01 13:00",
            "turns": [{"role": "user", "content": "My sister lives in Lisbon"}],
        }
    ]
    imports(ws, "later.json", later, **env)
    with vector_file.file_for(ws / "memory" / "vectors", MODEL).open("ab") as f:
        f.write(TORN_VECTOR)
    items = ws / "memory" / "items"
    (items / "snapshot.bin").unlink(missing_ok=True)
    (items / "lexical.npz").unlink(missing_ok=True)
    [log] = (items / "episodic").glob("*.jsonl")
    with log.open("ab") as f:
        f.write(TORN)
    (ws / "memory" / "MEMORY.md").write_text("- prefers short answers\n")
    os.chmod(ws / "memory" / "MEMORY.md", 0o640)
    return ws, log


def test_search_show_and_stats_beside_the_bot_change_no_byte_and_no_mode(tmp_path: Path) -> None:
    ws, log = bot_is_writing(tmp_path)
    vectors = vector_file.file_for(ws / "memory" / "vectors", MODEL)
    before = files(ws)
    assert str(vectors.relative_to(ws)) in before and before[str(vectors.relative_to(ws))][1] is not None
    found = membot("memory", "search", "green tea", workspace=ws)
    assert found.returncode == 0, found.stderr
    assert "green tea from Kyoto" in found.stdout and "Biscuit" not in found.stdout
    assert "may still be being written" in found.stderr and log.name in found.stderr
    by_meaning = membot("memory", "search", "my car", workspace=ws)  # read the vectors, torn row and all
    assert by_meaning.returncode == 0 and "Subaru Outback" in by_meaning.stdout, by_meaning.stderr
    shown = membot("memory", "show", "--query", "what is my dog called", workspace=ws)
    assert shown.returncode == 0, shown.stderr
    assert "Biscuit" in shown.stdout and "prefers short answers" in shown.stdout
    counted = membot("memory", "stats", workspace=ws)
    assert counted.returncode == 0, counted.stderr
    assert "episodic items" in counted.stdout
    assert files(ws) == before
    assert vectors.read_bytes().endswith(TORN_VECTOR)  # left for the bot's next append to cut


def test_search_finds_by_meaning_what_shares_no_word_with_the_query(tmp_path: Path) -> None:
    """`membot memory search` searched by words only: "my car" missed "I drive an old Subaru Outback",
    which the bot finds through the item's vector. What the bot has not embedded yet is counted."""
    ws, _ = bot_is_writing(tmp_path)
    found = membot("memory", "search", "my car", workspace=ws)
    assert found.returncode == 0, found.stderr
    assert "I drive an old Subaru Outback" in found.stdout
    held = set(vector_file.read(vector_file.file_for(ws / "memory" / "vectors", MODEL), MODEL)[1].keys)
    newest = [i for i in stored_items(ws) if "Lisbon" in i["content"] and "assistant" not in i["tags"]]
    assert newest and not {i["fingerprint"] for i in newest} & held  # imported after the reindex
    counted = re.search(r"(\d+) items? ha(?:s|ve) no vector yet", found.stderr)
    assert counted and int(counted.group(1)) == len(newest), found.stderr

    words_only = membot("memory", "search", "my car", workspace=ws, MEMBOT_MEMORY__EMBEDDINGS="none")
    assert words_only.returncode == 0 and "Subaru" not in words_only.stdout
    assert 'found by words only: memory.embeddings is "none"' in words_only.stderr


def test_search_with_an_embedding_model_that_fails_finds_by_words_and_says_so(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    tea = {"id": "t", "date": "2024-01-01 10:00", "turns": [{"role": "user", "content": "I love green tea"}]}
    imports(ws, "conv.json", [tea])
    model = "openai:text-embedding-3-small"
    vector_file.rewrite(  # the bot's vectors of that model, so that the query is embedded
        vector_file.file_for(ws / "memory" / "vectors", model),
        model,
        2,
        ["a-key"],
        np.eye(1, 2, dtype=np.float16),
    )
    before = files(ws)
    down = {
        "MEMBOT_MEMORY__EMBEDDINGS": "openai",
        "MEMBOT_MEMORY__EMBEDDINGS_BASE_URL": "http://127.0.0.1:9/v1",
    }
    found = membot("memory", "search", "green tea", workspace=ws, **down)
    assert found.returncode == 0 and "I love green tea" in found.stdout, found.stderr
    assert "(found by words only, as the embedding model gave no vector: LLMUnavailable" in found.stderr
    assert files(ws) == before


def stored_items(ws: Path) -> list[dict[str, Any]]:
    logs = sorted((ws / "memory" / "items").rglob("*.jsonl"))
    lines = [line for log in logs for line in log.read_bytes().splitlines() if line.strip()]
    return [json.loads(line) for line in lines if not line.endswith(TORN[-10:])]


def test_in_chat_scope_items_merged_across_chats_are_separated_in_memory_only(tmp_path: Path) -> None:
    """An item whose references name two chats (merged by an earlier version): the bot splits it at
    its start; a reader shows each chat only its own part, and writes no split."""
    ws, _ = bot_is_writing(tmp_path)
    semantic = ws / "memory" / "items" / "semantic.jsonl"
    [log] = (ws / "memory" / "items" / "episodic").glob("*.jsonl")
    lines = [json.loads(raw) for raw in log.read_bytes().splitlines()[:-1]]
    tea = next(line for line in lines if "green tea" in line["content"])
    dog = next(line for line in lines if "Biscuit" in line["content"])
    merged = {
        **tea,
        "id": "merged-one",
        "layer": "semantic",
        "references": tea["references"] + dog["references"],
    }
    semantic.write_text(json.dumps(merged) + "\n")
    os.chmod(semantic, 0o600)
    before = files(ws)
    scope = {"MEMBOT_MEMORY__SCOPE": "chat"}
    counted = membot("memory", "stats", workspace=ws, **scope)
    assert counted.returncode == 0, counted.stderr
    assert _row(counted.stdout, "semantic items") == "2"  # one per chat, as the bot counts them
    mine = membot("memory", "search", "green tea", "--session", "telegram:1", workspace=ws, **scope)
    assert mine.returncode == 0 and "green tea from Kyoto" in mine.stdout, mine.stderr
    assert files(ws) == before


def _row(table: str, name: str) -> str:
    [row] = [line for line in table.splitlines() if name in line]
    return row.replace("│", " ").split()[-1]


async def test_the_bots_own_start_still_keeps_the_torn_line_aside_and_mends_the_log(tmp_path: Path) -> None:
    """What the readers leave alone is the bot's to do: its start (as bot/app.py opens memory) keeps the
    torn line aside, rewrites the log without it and makes its memory private."""
    ws, log = bot_is_writing(tmp_path)
    memory = MemoryService(ws / "memory", MemorySettings(), timezone="UTC", maintain_every=timedelta(days=1))
    await memory.start()
    try:
        assert any("green tea from Kyoto" in hit.item.content for hit in await memory.search("green tea"))
    finally:
        await memory.close()
    (aside,) = log.parent.glob(log.name + ".damaged-*")
    assert aside.read_bytes() == TORN + b"\n"
    assert not log.read_bytes().endswith(TORN) and log.read_bytes().endswith(b"\n")
    assert (ws / "memory" / "items" / "snapshot.bin").exists()
    assert (ws / "memory" / "MEMORY.md").stat().st_mode & 0o777 == 0o600


def test_show_finds_by_meaning_as_the_bot_does_and_says_what_it_could_not(tmp_path: Path) -> None:
    """`membot memory show` found the memory it prints by its words only, so "my car" left out the
    Subaru that the bot's own prompt holds; now it finds as `search` does, with the same notes."""
    ws, _ = bot_is_writing(tmp_path)
    shown = membot("memory", "show", "--query", "my car", workspace=ws)
    assert shown.returncode == 0, shown.stderr
    assert "I drive an old Subaru Outback" in shown.stdout
    assert re.search(r"\d+ items? ha(?:s|ve) no vector yet", shown.stderr), shown.stderr
    words_only = membot("memory", "show", "--query", "my car", workspace=ws, MEMBOT_MEMORY__EMBEDDINGS="none")
    assert words_only.returncode == 0 and "Subaru" not in words_only.stdout
    assert 'found by words only: memory.embeddings is "none"' in words_only.stderr
