"""The session log's groups: a save commits with its state record, a torn one is dropped, damage is not."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from bot.domain import Message, Role
from bot.outbox import PendingReply
from bot.session_log import encode_group, read_log
from bot.sessions import JsonSessionStore, SessionService


def service(tmp_path: Path) -> SessionService:
    return SessionService(JsonSessionStore(tmp_path / "sessions"))


def log_path(tmp_path: Path) -> Path:
    return tmp_path / "sessions" / "cli:me.1.jsonl"


async def saved(tmp_path: Path, *texts: str) -> SessionService:
    sessions = service(tmp_path)
    session = await sessions.get_or_create("cli", "me")
    for text in texts:
        session.append(Message(Role.USER, text))
        session.usage.calls += 1
        await sessions.save(session)
    return sessions


async def test_a_group_cut_short_by_a_crash_is_not_part_of_the_session_and_is_cut_off(tmp_path: Path) -> None:
    await saved(tmp_path, "one", "two")
    whole = log_path(tmp_path).read_bytes()
    # The crash hit during the third save: its message is on disk, its state record is not.
    torn = encode_group([Message(Role.USER, "three")], [], {"never": "written"})
    log_path(tmp_path).write_bytes(whole + torn.split(b"\n")[0] + b"\n" + b'{"record":"sta')
    reloaded = await service(tmp_path).get("cli:me")
    assert reloaded is not None
    assert [m.content for m in reloaded.messages] == ["one", "two"]
    assert reloaded.usage.calls == 2
    reloaded.append(Message(Role.USER, "four"))
    await service(tmp_path).save(reloaded)
    assert log_path(tmp_path).read_bytes().startswith(whole)  # the torn group is gone, not kept
    again = await service(tmp_path).get("cli:me")
    assert again is not None and [m.content for m in again.messages] == ["one", "two", "four"]


async def test_a_damaged_line_before_saved_groups_is_damage_not_a_torn_append(tmp_path: Path) -> None:
    await saved(tmp_path, "one", "two", "three")
    lines = log_path(tmp_path).read_bytes().split(b"\n")
    lines[2] = b"\xff garbage"  # inside the second group; the third group is complete after it
    log_path(tmp_path).write_bytes(b"\n".join(lines))
    fresh = await service(tmp_path).get("cli:me")
    assert fresh is None  # moved aside for the operator instead of silently dropping "three"
    assert any(".corrupt-" in p.name for p in (tmp_path / "sessions").iterdir())


async def test_a_saved_reply_round_trips_and_does_not_repeat_the_answer_text(tmp_path: Path) -> None:
    sessions = service(tmp_path)
    session = await sessions.get_or_create("cli", "me")
    session.append(Message(Role.USER, "question"))
    session.append(Message(Role.ASSISTANT, "a long answer " * 20))
    answer = PendingReply("cli", "me", "a long answer " * 20, ("e1",), reply_to="m1")
    note = PendingReply("cli", "me", "another text", ("e2",), is_error=True)
    await sessions.save(session, replies=[answer, note])
    text = log_path(tmp_path).read_text()
    assert text.count("a long answer") == 20  # once, in the message; the reply points at it
    assert await service(tmp_path).replies("cli:me") == [answer, note]


def test_logs_written_before_state_records_still_load() -> None:
    old = b"".join(json.dumps(Message(Role.USER, f"m{i}").to_dict()).encode() + b"\n" for i in range(3))
    content = read_log(old + b'{"id": "torn', committed=len(old))
    assert [m.content for m in content.messages] == ["m0", "m1", "m2"]
    assert content.end == len(old) and content.state is None


async def test_peek_counts_messages_appended_since_the_last_rewrite(tmp_path: Path) -> None:
    await saved(tmp_path, "one", "two", "three")
    store = JsonSessionStore(tmp_path / "sessions")
    peek = await asyncio.to_thread(store.peek, store.header_path("cli:me"))
    assert peek is not None and (peek.id, peek.messages) == ("cli:me", 3)
    session = await service(tmp_path).get("cli:me")
    assert session is not None and peek.updated_at == session.updated_at
