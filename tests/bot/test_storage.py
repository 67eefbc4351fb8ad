"""Crash-safe file primitives: text no codec can encode, and temp files a kill left behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bot.domain import Message, Role
from bot.session_service import SessionService
from bot.sessions import JsonSessionStore
from bot.storage import append_line, atomic_write_text
from tests.bot.cli.membot_process import run_membot


def chat_env(home: Path, ws: Path) -> dict[str, str]:
    # A model that is never called: `membot chat` with empty input starts and quits.
    return {
        "HOME": str(home),
        "MEMBOT_WORKSPACE": str(ws),
        "MEMBOT_LLM__OPENAI__BASE_URL": "http://127.0.0.1:9/v1",
    }


LONE = "a lone \ud800 surrogate"
SHOWN = "a lone \ufffd surrogate"


def test_text_writes_replace_lone_surrogates_instead_of_failing(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "whole.txt", LONE)
    append_line(tmp_path / "log.txt", LONE)
    assert (tmp_path / "whole.txt").read_text(encoding="utf-8") == SHOWN
    assert (tmp_path / "log.txt").read_text(encoding="utf-8") == SHOWN + "\n"


async def test_a_session_holding_a_lone_surrogate_still_saves(tmp_path: Path) -> None:
    # However it got in (a tool result, say), one bad character must not make every later save fail.
    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"), cache_size=4)
    session = await sessions.get_or_create("cli", "me")
    session.append(Message(Role.TOOL, LONE, tool_call_id="c1", name="files"))
    await sessions.save(session)
    session.append(Message(Role.USER, "next"))
    await sessions.save(session)
    fresh = await SessionService(JsonSessionStore(tmp_path / "sessions"), cache_size=4).get("cli:me")
    assert fresh is not None and [m.content for m in fresh.messages] == [SHOWN, "next"]


def test_temp_files_left_by_a_kill_are_removed_at_start_and_nothing_else(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sessions").mkdir(parents=True)
    (ws / "notes").mkdir()
    stale = [ws / "sessions" / ".cli:ana.json.k3j_x9q2.tmp", ws / ".usage.json.abcdefgh.tmp"]
    fresh = ws / "sessions" / ".cli:bob.json.zz11yy22.tmp"  # a write in progress right now
    kept = [ws / "notes" / "draft.tmp", ws / "notes" / ".x.tmp", ws / "notes" / "a.b.abcdefgh.tmp"]
    for path in [*stale, fresh, *kept]:
        path.write_text("partial")
    hour_ago = time.time() - 3600
    for path in [*stale, *kept]:
        os.utime(path, (hour_ago, hour_ago))

    done = run_membot("chat", env=chat_env(tmp_path, ws), stdin="")  # starts, sees EOF, quits
    assert done.returncode == 0, done.stderr
    assert not any(p.exists() for p in stale)
    assert fresh.exists() and all(p.exists() for p in kept)
