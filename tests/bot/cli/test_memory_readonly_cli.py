"""``membot memory search|show|stats`` run beside the bot, which owns the files: they only read."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import timedelta
from pathlib import Path

from bot.config import MemorySettings
from bot.memory import MemoryService
from tests.bot.cli.membot_process import run_membot


def membot(*args: str, workspace: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"MEMBOT_WORKSPACE": str(workspace), "HOME": str(workspace.parent), "COLUMNS": "200"}
    return run_membot(*args, env={**base, **env})


TORN = b'{"id": "torn-item", "layer": "episodic", "content": "half a li'


def files(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under ``root`` (folders too) with its mode and, for a file, its bytes."""
    out: dict[str, tuple[int, bytes | None]] = {}
    for folder, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            path = Path(folder) / name
            mode = path.lstat().st_mode
            out[str(path.relative_to(root))] = (mode, None if path.is_dir() else path.read_bytes())
    return out


def bot_is_writing(tmp_path: Path, **env: str) -> tuple[Path, Path]:
    """A workspace as `membot memory search` may find it beside a running bot: an item log whose last line
    is still being appended (torn), no snapshot of the items (the bot saves it at its stop), and a
    note the operator saved with another mode; returns the workspace and the torn log."""
    export = tmp_path / "conv.json"
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
    ]
    export.write_text(json.dumps({"sessions": sessions}))
    ws = tmp_path / "ws"
    imported = membot("memory", "import", str(export), workspace=ws, **env)
    assert imported.returncode == 0, imported.stderr
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
    before = files(ws)
    found = membot("memory", "search", "green tea", workspace=ws)
    assert found.returncode == 0, found.stderr
    assert "green tea from Kyoto" in found.stdout and "Biscuit" not in found.stdout
    assert "may still be being written" in found.stderr and log.name in found.stderr
    shown = membot("memory", "show", "--query", "what is my dog called", workspace=ws)
    assert shown.returncode == 0, shown.stderr
    assert "Biscuit" in shown.stdout and "prefers short answers" in shown.stdout
    counted = membot("memory", "stats", workspace=ws)
    assert counted.returncode == 0, counted.stderr
    assert "episodic items" in counted.stdout
    assert files(ws) == before


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
