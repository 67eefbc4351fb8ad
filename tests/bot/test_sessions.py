"""SessionService and the JSON store: atomicity, corruption, hostile ids, LRU, concurrency."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.domain import Message, Role, ToolCall
from bot.errors import StorageError
from bot.session_names import encode_id
from bot.session_service import SessionService
from bot.sessions import JsonSessionStore
from bot.storage import atomic_write_bytes


def service(tmp_path: Path, cache_size: int = 8) -> SessionService:
    return SessionService(JsonSessionStore(tmp_path / "sessions"), cache_size=cache_size)


async def test_round_trip_keeps_everything(tmp_path: Path) -> None:
    sessions = service(tmp_path)
    session = await sessions.get_or_create("telegram", "777")
    session.append(Message(Role.USER, "hi there"))
    session.append(Message(Role.ASSISTANT, "", tool_calls=(ToolCall("c1", "time", "{}"),), token_estimate=12))
    session.append(Message(Role.TOOL, "12:00", tool_call_id="c1", name="time"))
    session.usage.input_tokens = 42
    session.metadata["k"] = "v"
    await sessions.save(session)

    fresh = await service(tmp_path).get("telegram:777")
    assert fresh is not None
    assert [m.to_dict() for m in fresh.messages] == [m.to_dict() for m in session.messages]
    assert fresh.usage.input_tokens == 42 and fresh.metadata == {"k": "v"}
    assert (tmp_path / "sessions" / "telegram:777.json").is_file()


async def test_saves_append_and_rewrites_switch_generation(tmp_path: Path) -> None:
    sessions = service(tmp_path)
    session = await sessions.get_or_create("cli", "me")
    header = tmp_path / "sessions" / "cli:me.json"
    for i in range(5):
        session.append(Message(Role.USER, f"m{i}"))
        session.usage.calls += 1
        await sessions.save(session)
        if i == 0:
            first_header = header.read_bytes()
    log_files = sorted(p.name for p in (tmp_path / "sessions").glob("*.jsonl"))
    assert log_files == ["cli:me.1.jsonl"]
    lines = [json.loads(x) for x in (tmp_path / "sessions" / "cli:me.1.jsonl").read_text().splitlines()]
    assert [x["content"] for x in lines if "role" in x] == [f"m{i}" for i in range(5)]
    assert header.read_bytes() == first_header  # appends carry the state; the header is not replaced
    appended = await service(tmp_path).get("cli:me")
    assert appended is not None and appended.usage.calls == 5

    session.replace_messages(session.messages[-2:])
    await sessions.save(session)
    log_files = sorted(p.name for p in (tmp_path / "sessions").glob("*.jsonl"))
    assert log_files == ["cli:me.2.jsonl"]
    reloaded = await service(tmp_path).get("cli:me")
    assert reloaded is not None and [m.content for m in reloaded.messages] == ["m3", "m4"]


async def test_torn_append_after_crash_is_ignored_and_cut(tmp_path: Path) -> None:
    sessions = service(tmp_path)
    session = await sessions.get_or_create("cli", "me")
    session.append(Message(Role.USER, "kept"))
    await sessions.save(session)
    # A crash mid-append: half a line after the committed length, header never updated.
    with open(tmp_path / "sessions" / "cli:me.1.jsonl", "ab") as f:
        f.write(b'{"id":"x","role":"user","cont')
    reloaded = await service(tmp_path).get("cli:me")
    assert reloaded is not None and [m.content for m in reloaded.messages] == ["kept"]
    reloaded.append(Message(Role.USER, "next"))
    await service(tmp_path).save(reloaded)
    again = await service(tmp_path).get("cli:me")
    assert again is not None and [m.content for m in again.messages] == ["kept", "next"]


def test_crash_during_atomic_write_leaves_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    atomic_write_bytes(target, b"old")

    class Boom(Exception):
        pass

    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        raise Boom

    os.fsync = failing_fsync  # simulate the machine dying before the data is durable
    try:
        with pytest.raises(Boom):
            atomic_write_bytes(target, b"new content")
    finally:
        os.fsync = real_fsync
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temp file left behind


@pytest.mark.parametrize("garbage", [b"{not json", b'{"id": "someone:else"}', b"[]", b"", b'{"id": "\xff'])
async def test_a_damaged_header_is_rebuilt_from_the_log_and_kept_aside(
    tmp_path: Path, garbage: bytes
) -> None:
    sessions = service(tmp_path)
    session = await sessions.get_or_create("cli", "me")
    session.append(Message(Role.USER, "hello"))
    await sessions.save(session)
    session.append(Message(Role.USER, "again"))
    session.usage.calls = 7
    await sessions.save(session)
    (tmp_path / "sessions" / "cli:me.json").write_bytes(garbage)

    for _ in range(2):  # the rebuilt header is written: the second load reads it
        rebuilt = await service(tmp_path).get("cli:me")
        assert rebuilt is not None
        assert [m.content for m in rebuilt.messages] == ["hello", "again"] and rebuilt.usage.calls == 7
    [kept] = (tmp_path / "sessions").glob("cli:me.json.damaged-*")
    assert kept.read_bytes() == garbage + b"\n"
    rebuilt.append(Message(Role.USER, "more"))
    await sessions.save(rebuilt)
    again = await service(tmp_path).get("cli:me")
    assert again is not None and [m.content for m in again.messages] == ["hello", "again", "more"]


async def test_a_header_a_newer_membot_wrote_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    """After a rollback, a header of a newer format read as this one's would lose what this version does
    not know at the next rewrite: the load is refused with the fix, and nothing on disk changes."""
    sessions = service(tmp_path)
    session = await sessions.get_or_create("cli", "me")
    session.append(Message(Role.USER, "hello"))
    await sessions.save(session)
    header = tmp_path / "sessions" / "cli:me.json"
    newer = {**json.loads(header.read_bytes()), "version": 2, "pinned_notes": ["from the future"]}
    header.write_text(json.dumps(newer))
    before = sorted((p.name, p.read_bytes()) for p in (tmp_path / "sessions").iterdir())

    with pytest.raises(StorageError, match=r"written by a newer membot .*format 2"):
        await service(tmp_path).get("cli:me")
    assert sorted((p.name, p.read_bytes()) for p in (tmp_path / "sessions").iterdir()) == before


async def test_a_read_only_load_of_a_header_naming_a_missing_log_says_what_may_be_wrong(
    tmp_path: Path,
) -> None:
    """`membot sessions show` on a copy of a running bot's workspace: the header names a log the copy
    lacks. It said only "kept changing while it was read: try again", which no retry mends."""
    sessions = service(tmp_path)
    session = await sessions.get_or_create("cli", "me")
    session.append(Message(Role.USER, "hello"))
    await sessions.save(session)
    [log] = (tmp_path / "sessions").glob("cli:me.*.jsonl")
    log.rename(log.with_name("cli:me.7.jsonl"))  # the copy holds another generation's log

    with pytest.raises(StorageError, match="copy taken while the bot ran"):
        await JsonSessionStore(tmp_path / "sessions", read_only=True).load("cli:me")


async def test_a_header_no_log_stands_in_for_is_moved_aside_and_the_session_starts_fresh(
    tmp_path: Path,
) -> None:
    sessions = service(tmp_path)
    session = await sessions.get_or_create("cli", "me")
    session.append(Message(Role.USER, "hello"))
    await sessions.save(session)
    (tmp_path / "sessions" / "cli:me.json").write_bytes(b"{not json")
    (tmp_path / "sessions" / "cli:me.1.jsonl").write_bytes(b"")  # a log with no state record either

    fresh = await service(tmp_path).get_or_create("cli", "me")
    assert fresh.messages == []
    names = [p.name for p in (tmp_path / "sessions").iterdir()]
    assert any(n.startswith("cli:me.json.corrupt-") for n in names)
    assert any(n.startswith("cli:me.1.jsonl.corrupt-") for n in names)


async def test_a_folder_where_the_header_belongs_is_moved_aside_and_the_session_kept(tmp_path: Path) -> None:
    """A folder in the header's place failed every load (and so every turn of the chat) as if the disk
    could not be read for now; it never becomes readable by itself."""
    sessions = service(tmp_path)
    session = await sessions.get_or_create("cli", "me")
    session.append(Message(Role.USER, "hello"))
    await sessions.save(session)
    header = tmp_path / "sessions" / "cli:me.json"
    header.unlink()
    header.mkdir()
    (header / "note").write_text("an operator's file")

    for _ in range(2):
        kept = await service(tmp_path).get("cli:me")
        assert kept is not None and [m.content for m in kept.messages] == ["hello"]
    [folder] = (tmp_path / "sessions").glob("cli:me.json.corrupt-*")
    assert (folder / "note").read_text() == "an operator's file"


async def test_a_header_of_another_session_is_moved_aside(tmp_path: Path) -> None:
    sessions = service(tmp_path)
    for chat in ("me", "you"):
        session = await sessions.get_or_create("cli", chat)
        session.append(Message(Role.USER, f"hello {chat}"))
        await sessions.save(session)
    folder = tmp_path / "sessions"
    (folder / "cli:me.json").write_bytes((folder / "cli:you.json").read_bytes())
    fresh = await service(tmp_path).get_or_create("cli", "me")
    assert fresh.messages == []
    assert any(p.name.startswith("cli:me.json.corrupt-") for p in folder.iterdir())


async def test_corrupt_log_line_is_moved_aside(tmp_path: Path) -> None:
    sessions = service(tmp_path)
    session = await sessions.get_or_create("cli", "me")
    session.append(Message(Role.USER, "hello"))
    await sessions.save(session)
    log_path = tmp_path / "sessions" / "cli:me.1.jsonl"
    log_path.write_bytes(b"X" * log_path.stat().st_size)
    fresh = await service(tmp_path).get_or_create("cli", "me")
    assert fresh.messages == []


HOSTILE = [
    "../../etc/passwd",
    "/abs/path",
    "a/b",
    "nul\x00byte",
    "x" * 5000,
    "ünïcødé 🎉",
    ".",
    "..",
    ".hidden",
    "%2F",
    "a:b:c",
    "CON",
    " spaced ",
    "~tilde",
    "-rf",
]


@pytest.mark.parametrize("chat", HOSTILE)
async def test_hostile_ids_stay_inside_the_folder(tmp_path: Path, chat: str) -> None:
    sessions = service(tmp_path)
    session = await sessions.get_or_create("telegram", chat)
    session.append(Message(Role.USER, "x"))
    await sessions.save(session)
    folder = tmp_path / "sessions"
    for path in folder.rglob("*"):
        assert path.parent == folder
        assert len(path.name.encode()) < 255
    reloaded = await service(tmp_path).get(session.id)
    assert reloaded is not None and reloaded.id == session.id


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=300), st.text(min_size=0, max_size=300))
def test_encoded_ids_never_collide_or_escape(a: str, b: str) -> None:
    ea, eb = encode_id(a), encode_id(b)
    assert "/" not in ea and "\x00" not in ea and not ea.startswith(".")
    if a != b:
        assert ea != eb


async def test_lru_evicts_and_reloads_from_disk(tmp_path: Path) -> None:
    sessions = service(tmp_path, cache_size=2)
    for chat in ("a", "b", "c"):
        s = await sessions.get_or_create("cli", chat)
        s.append(Message(Role.USER, f"hello {chat}"))
        await sessions.save(s)
    assert sessions.cached == 2
    a = await sessions.get("cli:a")  # evicted earlier, read back from disk
    assert a is not None and a.messages[0].content == "hello a"


async def test_leased_session_is_not_evicted(tmp_path: Path) -> None:
    sessions = service(tmp_path, cache_size=1)
    async with sessions.lease("cli", "busy") as busy:
        busy.append(Message(Role.USER, "unsaved"))
        other = await sessions.get_or_create("cli", "other")
        await sessions.save(other)
        again = await sessions.get_or_create("cli", "busy")
        assert again is busy  # one live copy, never a stale reload


async def test_a_new_session_is_held_from_its_lease_on_when_every_other_is_leased(tmp_path: Path) -> None:
    sessions = service(tmp_path, cache_size=1)
    async with sessions.lease("cli", "busy"), sessions.lease("cli", "new") as new:
        new.append(Message(Role.USER, "unsaved"))
        again = await sessions.get_or_create("cli", "new")
        assert again is new  # not evicted the moment it was made, and so not made twice


async def test_sessions_past_the_cache_leave_least_recently_used_first(tmp_path: Path) -> None:
    sessions = service(tmp_path, cache_size=2)
    async with sessions.lease("cli", "busy"):
        for chat in ("a", "b", "c"):
            async with sessions.lease("cli", chat) as s:
                s.append(Message(Role.USER, f"hello {chat}"))
                await sessions.save(s)
        assert {s.id for s in sessions.cached_sessions()} == {"cli:busy", "cli:c"}
    unsaved = await sessions.get_or_create("cli", "d")
    unsaved.append(Message(Role.USER, "not saved yet"))
    await sessions.get_or_create("cli", "e")
    assert await sessions.get_or_create("cli", "d") is unsaved  # never evicted before it is saved
    assert sessions.cached == 2 and "cli:busy" not in {s.id for s in sessions.cached_sessions()}


async def test_concurrent_saves_of_different_sessions(tmp_path: Path) -> None:
    sessions = service(tmp_path, cache_size=64)

    async def chat(i: int) -> None:
        s = await sessions.get_or_create("cli", f"user{i}")
        for j in range(10):
            s.append(Message(Role.USER, f"{i}-{j}"))
            await sessions.save(s)

    await asyncio.gather(*(chat(i) for i in range(20)))
    fresh = service(tmp_path, cache_size=64)
    for i in range(20):
        s = await fresh.get(f"cli:user{i}")
        assert s is not None and [m.content for m in s.messages] == [f"{i}-{j}" for j in range(10)]


async def test_delete_clear_and_count(tmp_path: Path) -> None:
    sessions = service(tmp_path)
    s = await sessions.get_or_create("cli", "me")
    s.append(Message(Role.USER, "x"))
    await sessions.save(s)
    assert await sessions.message_count("cli:me") == 1
    await sessions.clear_messages(s)
    assert await service(tmp_path).message_count("cli:me") == 0
    assert await sessions.list_ids() == ["cli:me"]
    assert await sessions.delete("cli:me") is True
    assert list((tmp_path / "sessions").iterdir()) == []


async def test_files_are_private(tmp_path: Path) -> None:
    sessions = service(tmp_path)
    s = await sessions.get_or_create("cli", "me")
    s.append(Message(Role.USER, "secret"))
    await sessions.save(s)
    folder = tmp_path / "sessions"
    assert folder.stat().st_mode & 0o777 == 0o700
    for path in folder.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600
    header = json.loads((folder / "cli:me.json").read_text())
    assert header["log_count"] == 1


async def test_changed_since_names_the_sessions_written_after_a_time(tmp_path: Path) -> None:
    """What a start after a power cut looks at (bot/memory/lazy_sync.py): by the files' modification
    times, header or log, with ids that hold dots (a log is ``<id>.<generation>.jsonl``)."""
    sessions = service(tmp_path)
    for chat in ("old", "v1.2.3", "new"):
        session = await sessions.get_or_create("discord", chat)
        session.append(Message(Role.USER, f"hello from {chat}"))
        await sessions.save(session)
    store = sessions.store
    assert isinstance(store, JsonSessionStore)
    long_ago = 1_000_000_000.0  # 2001: every file but the ones touched below looks old
    for path in store.directory.iterdir():
        os.utime(path, (long_ago, long_ago))
    now = datetime.now(UTC)
    dotted = await sessions.get("discord:v1.2.3")
    assert dotted is not None
    dotted.append(Message(Role.USER, "a second message"))  # appended to its log: the header stays old
    await sessions.save(dotted)
    header = await asyncio.to_thread(store.header_path("discord:v1.2.3").stat)
    assert header.st_mtime == long_ago  # so it is found by its log's name
    os.utime(store.header_path("discord:new"), None)
    changed = await sessions.changed_since(now - timedelta(seconds=5))
    assert sorted(changed) == ["discord:new", "discord:v1.2.3"]
    assert sorted(await sessions.changed_since(datetime.fromtimestamp(0, UTC))) == [
        "discord:new",
        "discord:old",
        "discord:v1.2.3",
    ]


async def test_a_reader_beside_the_bot_never_moves_its_session_aside(tmp_path: Path) -> None:
    """``membot sessions show|export`` read while the bot rewrites the session (first save, compaction,
    /new: a new log generation, the header swapped, the old log unlinked). A reader that repaired what
    it could not read moved the live files aside in that gap; a read-only one reads the new log."""
    sessions = service(tmp_path)
    session = await sessions.get_or_create("cli", "me")
    session.append(Message(Role.USER, "hello"))
    await sessions.save(session)
    reader = JsonSessionStore(tmp_path / "sessions", read_only=True)
    done = False
    seen: list[int] = []
    errors: list[BaseException] = []

    def read() -> None:
        while not done:
            try:
                loaded = asyncio.run(reader.load("cli:me"))
                seen.append(len(loaded.messages) if loaded is not None else -1)
            except BaseException as exc:  # collected for the assertion
                errors.append(exc)

    thread = asyncio.get_running_loop().run_in_executor(None, read)
    for i in range(300):  # a rewrite every save: the race's gap opens 300 times
        session.append(Message(Role.USER, f"m{i}"))
        session.replace_messages(session.messages[-3:])
        await sessions.save(session)
        await asyncio.sleep(0)
    done = True
    await thread
    folder = tmp_path / "sessions"
    assert not [p.name for p in folder.iterdir() if ".corrupt-" in p.name]
    assert errors == [] and seen and -1 not in seen
    final = await service(tmp_path).get("cli:me")
    assert final is not None and [m.content for m in final.messages] == ["m297", "m298", "m299"]


async def test_a_reader_beside_the_bot_leaves_a_damaged_session_to_the_bot(tmp_path: Path) -> None:
    sessions = service(tmp_path)
    session = await sessions.get_or_create("cli", "me")
    session.append(Message(Role.USER, "hello"))
    await sessions.save(session)
    folder = tmp_path / "sessions"
    (folder / "cli:me.json").write_bytes(b"{not json")
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(StorageError, match="damaged"):
        await JsonSessionStore(folder, read_only=True).load("cli:me")
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing rebuilt, moved or set aside
    rebuilt = await service(tmp_path).get("cli:me")  # the owner repairs it
    assert rebuilt is not None and [m.content for m in rebuilt.messages] == ["hello"]


async def test_a_log_generation_a_kill_left_behind_is_deleted_at_load_and_the_session_kept(
    tmp_path: Path,
) -> None:
    """A kill between a rewrite's header rename and the unlink of the old log left that log on disk
    for good: no later load or save looked at it again (a small disk leak per kill)."""
    sessions = service(tmp_path)
    session = await sessions.get_or_create("cli", "me")
    session.append(Message(Role.USER, "old"))
    await sessions.save(session)  # generation 1
    folder = tmp_path / "sessions"
    stale = (folder / "cli:me.1.jsonl").read_bytes()
    session.replace_messages([Message(Role.USER, "kept")])
    session.append(Message(Role.ASSISTANT, "answer"))
    await sessions.save(session)  # a rewrite: generation 2, the header renamed, generation 1 unlinked
    (folder / "cli:me.1.jsonl").write_bytes(stale)  # as a kill right after the header's rename left it
    other = await sessions.get_or_create("cli", "me.1")  # another session whose name shares the prefix
    other.append(Message(Role.USER, "other"))
    await sessions.save(other)
    (folder / "cli:me.3.jsonl").write_bytes(b"")  # a newer one (a kill before the header's rename): kept

    fresh = await service(tmp_path).get("cli:me")

    assert fresh is not None and [m.content for m in fresh.messages] == ["kept", "answer"]
    assert sorted(p.name for p in folder.glob("*.jsonl")) == [
        "cli:me.1.1.jsonl",
        "cli:me.2.jsonl",
        "cli:me.3.jsonl",
    ]
    again = await service(tmp_path).get("cli:me.1")
    assert again is not None and [m.content for m in again.messages] == ["other"]
