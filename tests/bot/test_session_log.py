"""The session log's groups: a save commits with its state record, a torn one is dropped, damage costs itself."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bot.domain import Message, Role
from bot.outbox import PendingReply
from bot.session_log import encode_group, read_log
from bot.session_service import SessionService
from bot.sessions import JsonSessionStore


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


def set_aside(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "sessions").glob("*.damaged-*"))


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


DAMAGE = {
    "torn json": b'{"id":"x","role":"us',
    "invalid utf-8": b'{"id":"x","role":"user","content":"\xff\xfe"}',
    "not an object": b"[1, 2]",
    "unknown role": b'{"id":"x","role":"nonsense","content":"hi"}',
    "number out of range": b'{"id":"x","role":"user","content":"hi","tokens":Infinity}',
    "bad state record": b'{"record":"state","session":{"updated_at":"yesterday"}}',
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
async def test_a_damaged_middle_line_costs_only_itself_and_its_bytes_are_kept_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: bytes
) -> None:
    await saved(tmp_path, "one", "two", "three")
    lines = log_path(tmp_path).read_bytes().split(b"\n")
    # Line 0 is "one" (the rewrite), 1 its state; 2 is "two" (an append), 3 its state; 4 and 5 "three".
    lines[2 if b"state" not in damage else 3] = damage
    log_path(tmp_path).write_bytes(b"\n".join(lines))

    sessions = service(tmp_path)
    session = await sessions.get("cli:me")
    assert session is not None
    expected = ["one", "three"] if b"state" not in damage else ["one", "two", "three"]
    assert [m.content for m in session.messages] == expected
    assert session.usage.calls == 3  # the last state record still counts
    [kept] = set_aside(tmp_path)
    assert kept.read_bytes() == damage + b"\n"
    [warning] = logged(caplog, "session_log_lines_set_aside")
    assert warning["kept_in"] == str(kept) and warning["session_id"] == "cli:me"

    # The next save rewrites the log without the damaged line and loses nothing more.
    session.append(Message(Role.USER, "four"))
    await sessions.save(session)
    assert not log_path(tmp_path).exists()  # generation 2 replaced it; the damaged bytes are aside
    caplog.clear()
    again = await service(tmp_path).get("cli:me")
    assert again is not None and [m.content for m in again.messages] == [*expected, "four"]
    assert logged(caplog, "session_log_lines_set_aside") == [] and set_aside(tmp_path) == [kept]


async def test_damage_read_twice_before_a_save_is_kept_once(tmp_path: Path) -> None:
    await saved(tmp_path, "one", "two", "three")
    lines = log_path(tmp_path).read_bytes().split(b"\n")
    lines[0] = b"\x00" * 12  # inside the rewrite's bytes (the header's log_bytes)
    log_path(tmp_path).write_bytes(b"\n".join(lines))
    for _ in range(2):  # two starts, no save in between
        session = await service(tmp_path).get("cli:me")
        assert session is not None and [m.content for m in session.messages] == ["two", "three"]
    [kept] = set_aside(tmp_path)
    assert kept.read_bytes() == b"\x00" * 12 + b"\n"


async def test_a_save_cut_short_is_kept_aside_before_the_next_append_cuts_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await saved(tmp_path, "one", "two")
    torn = b'{"id":"x","role":"user","content":"thr'
    with log_path(tmp_path).open("ab") as f:
        f.write(torn)
    sessions = service(tmp_path)
    session = await sessions.get("cli:me")
    assert session is not None and [m.content for m in session.messages] == ["one", "two"]
    [kept] = set_aside(tmp_path)
    assert kept.read_bytes() == torn + b"\n"
    assert logged(caplog, "session_log_unfinished_save_set_aside")[0]["kept_in"] == str(kept)
    session.append(Message(Role.USER, "four"))
    await sessions.save(session)
    assert torn not in log_path(tmp_path).read_bytes()  # cut off by the append, as before


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
