"""The start's file modes (bot/startup.py ``prepare_workspace``): private, a file an operator froze stays
frozen, and the bot's own state is writable by the bot again."""

from __future__ import annotations

import os
from pathlib import Path

from bot.config import load_settings
from bot.startup import prepare_workspace

BOT_STATE = [
    "inbox/telegram:42.jsonl",
    "sessions/telegram:42.json",
    "sessions/telegram:42.1.jsonl",
    "state/telegram_updates.json",
    "logs/membot.log",
    "usage.json",
    "usage.json.journal",
    "pairing.json",
    "memory/items/episodic/2026-11-28.jsonl",
    "memory/archive/telegram:42.jsonl",
    "memory/pending/x.json",
    "memory/vectors/model.vec",
    "memory/.MEMORY.md.lock",
]
OPERATORS = ["memory/MEMORY.md", "memory/HISTORY.md", "memory/2026-11-28.md", "notes/todo.md", ".env"]


def test_a_workspace_restored_read_only_gives_the_bot_its_state_back_and_leaves_frozen_files_frozen(
    tmp_path: Path,
) -> None:
    """A backup restored (or a folder copied) with 0444 files: the start made everything 0600 before
    (a MEMORY.md the operator froze too); since files only lose permissions there, the bot's inbox,
    sessions and memory records stayed read-only, and a bot that is not root (the Docker image's user)
    could take no message in (storage_unavailable, retried for ever)."""
    workspace = tmp_path / "ws"
    for rel in BOT_STATE + OPERATORS:
        path = workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x\n")
        os.chmod(path, 0o444)
    settings = load_settings(None, env_file=None, overrides={"workspace": workspace})

    prepare_workspace(settings)

    modes = {rel: (workspace / rel).stat().st_mode & 0o777 for rel in BOT_STATE + OPERATORS}
    assert {rel: modes[rel] for rel in BOT_STATE} == dict.fromkeys(BOT_STATE, 0o600)
    assert {rel: modes[rel] for rel in OPERATORS} == dict.fromkeys(OPERATORS, 0o400)  # (others' read gone)
