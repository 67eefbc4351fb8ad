"""Crash-safe file primitives: text no codec can encode, and temp files a kill left behind."""

from __future__ import annotations

from pathlib import Path

from bot.domain import Message, Role
from bot.sessions import JsonSessionStore, SessionService
from bot.storage import append_line, atomic_write_text

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
