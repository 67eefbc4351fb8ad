"""A Telegram group upgraded to a supergroup keeps its conversation and memory, on the real ``membot run``
process against the fake Bot API: the new chat id is a new session id, which started empty while the
group's conversation stayed behind in ``telegram:<old id>``. Now the move is recorded when Telegram
announces it and carried at the next start (the operator's restart with the new id allowed)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from bot.domain import InboundMessage, Message, Role, Session, utcnow
from bot.inbox import Inbox
from bot.memory.item_store import ItemStore
from bot.memory.pending import PendingConsolidations
from bot.model_wait import WAIT_FILE, WaitRecords
from bot.outbox import PendingReply
from bot.recovery import recover
from bot.session_moves import MOVES_FILE, carry_moves, record_move
from bot.session_names import encode_id
from bot.session_service import SessionService
from bot.sessions import JsonSessionStore
from bot.tools import ToolJournal
from tests.bot.cli.membot_process import run_membot
from tests.bot.membot_service import membot_run, stored, telegram_env, wait_in_flight
from tests.bot.test_crash_recovery import stop, wait_answer
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.telegram_server import FakeTelegramServer

OLD, NEW = -4001, -1004001
BOT = "membot_test_bot"
UPGRADED = (400, "Bad Request: group chat was upgraded to a supergroup chat")  # the old id, from then on


def group_env(tg: FakeTelegramServer, group: int) -> dict[str, str]:
    return telegram_env(tg, MEMBOT_TELEGRAM__ALLOWED_GROUPS=f'["{group}"]', MEMBOT_MEMORY__SCOPE="chat")


async def recorded(workspace: Path) -> None:
    """Until the channel wrote the move down (before it released Telegram's service message)."""
    path = workspace / "state" / MOVES_FILE
    async with asyncio.timeout(30):
        while str(NEW) not in (path.read_text() if path.exists() else ""):
            await asyncio.sleep(0.02)


async def test_the_supergroup_goes_on_with_the_groups_conversation_and_memory(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        async with membot_run(workspace, llm, **group_env(tg, OLD)) as service:
            tg.push_message(f"@{BOT} the milk is in the fridge", chat_id=OLD, chat_type="group", user_id=42)
            await wait_answer(tg, OLD, "the milk is in the fridge")
            tg.push_message(None, chat_id=OLD, chat_type="group", migrate_to_chat_id=NEW)
            tg.push_message(None, chat_id=NEW, chat_type="supergroup", migrate_from_chat_id=OLD)
            await recorded(workspace)
            await stop(service)
        assert service.logged("telegram_group_migrated")
        assert f"add {NEW} to telegram.allowed_groups" in service.stderr  # (allowed by id: say so)
        old_folder = workspace / "memory" / "chats" / encode_id(f"telegram:{OLD}")
        assert old_folder.exists()  # the group's own notes, in chat scope
        async with membot_run(workspace, llm, **group_env(tg, NEW)) as service:
            tg.push_message(f"@{BOT} where is the milk?", chat_id=NEW, chat_type="supergroup", user_id=42)
            await wait_answer(tg, NEW, "where is the milk?")
            await stop(service)
        sent = [m["content"] for m in llm.requests[-1].body["messages"] if m["role"] == "user"]
        assert any("the milk is in the fridge" in str(text) for text in sent)  # the conversation followed
    contents = [text for _, text in await asyncio.to_thread(stored, workspace, f"telegram:{NEW}")]
    assert "the milk is in the fridge" in contents[0] and "where is the milk?" in contents[2]
    assert not (workspace / "sessions" / f"{encode_id(f'telegram:{OLD}')}.json").exists()
    assert not old_folder.exists()
    assert (workspace / "memory" / "chats" / encode_id(f"telegram:{NEW}")).is_dir()
    items = ItemStore(workspace / "memory" / "items", per_chat=True)
    await items.load()
    chats = {ref.session_id for item in items.items() for ref in item.references}
    assert chats == {f"telegram:{NEW}"}  # (the milk's item is the supergroup's own now)
    assert json.loads((workspace / "state" / MOVES_FILE).read_text()) == {}  # done: not carried again


async def test_a_message_the_group_was_not_answered_is_answered_in_the_supergroup(tmp_path: Path) -> None:
    """Accepted (so Telegram does not send it again) and killed mid-turn: its inbox entry goes along with
    the conversation, and the answer goes to the supergroup, once; the old id refuses every send."""
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(text="never finished", delay=60))
        async with membot_run(workspace, llm, **group_env(tg, OLD)) as service:
            tg.push_message(f"@{BOT} is the milk cold?", chat_id=OLD, chat_type="group", user_id=42)
            await wait_in_flight(llm)
            tg.push_message(None, chat_id=OLD, chat_type="group", migrate_to_chat_id=NEW)
            await recorded(workspace)
            await service.kill()
        tg.refuse_chat(OLD, UPGRADED)
        llm.script(FakeReply(text="Yes, cold."))
        async with membot_run(workspace, llm, **group_env(tg, NEW)) as service:
            await wait_answer(tg, NEW, "Yes, cold.")
            await stop(service)
        assert [m.text for m in tg.sent_to(NEW)] == ["Yes, cold."]
        assert llm.requests[-1].body["messages"][-1]["content"].endswith("is the milk cold?")
    assert not (workspace / "inbox" / f"{encode_id(f'telegram:{OLD}')}.jsonl").exists()


async def test_the_inbox_moves_once_even_when_a_kill_comes_before_the_old_file_is_removed(
    tmp_path: Path,
) -> None:
    """Pending messages and kept answers go to the new id, ahead of its own; a second carry (the old
    file back, as a kill before its removal leaves it) adds nothing; answers the session log saved go
    along too."""
    store, state, inbox_dir = JsonSessionStore(tmp_path / "sessions"), tmp_path / "state", tmp_path / "inbox"
    old, new = "telegram:-1", "telegram:-1001"
    inbox = Inbox(inbox_dir)
    await inbox.load_pending()
    first, durable = inbox.add(InboundMessage("telegram", "-1", "42", "first", message_id="5", is_group=True))
    await durable
    second, durable = inbox.add(
        InboundMessage("telegram", "-1", "42", "second", message_id="6", is_group=True)
    )
    await durable
    kept = PendingReply("telegram", "-1", "the answer to first", (first,), reply_to="5")
    await inbox.keep(kept)
    saved = PendingReply("telegram", "-1", "the answer to second", (second,), reply_to="6")
    await store.save(session(old, "first", "second"), replies=[saved])
    _, durable = inbox.add(InboundMessage("telegram", "-1001", "42", "third", message_id="1", is_group=True))
    await durable
    await record_move(state, old, new)
    old_file = inbox.file(old)
    lines = old_file.read_bytes()
    await carry_moves(state, store, None, inbox_dir=inbox_dir)
    assert not old_file.exists()
    old_file.write_bytes(lines)  # as a kill between the write and the removal leaves it
    await record_move(state, old, new)
    await carry_moves(state, store, None, inbox_dir=inbox_dir)
    assert not old_file.exists()
    after = Inbox(inbox_dir)
    pending = await after.load_pending()
    assert [(e.message.session_id, e.message.text) for e in pending] == [
        (new, "first"),
        (new, "second"),
        (new, "third"),
    ]
    assert [(r.id, r.chat_id) for r in after.kept_replies(new)] == [(kept.id, "-1001")]
    assert [(r.id, r.chat_id) for r in await store.replies(new)] == [(saved.id, "-1001")]


def session(sid: str, *texts: str) -> Session:
    channel, _, chat = sid.partition(":")
    return Session(sid, channel, chat, messages=[Message(Role.USER, t) for t in texts])


async def test_a_move_a_kill_cut_short_is_finished_and_one_made_twice_changes_nothing(tmp_path: Path) -> None:
    """Killed between writing the new session and deleting the old: the next start deletes the old one
    (the new one says where it came from), and the move is not made again."""
    store, state = JsonSessionStore(tmp_path / "sessions"), tmp_path / "state"
    old, new = "telegram:-1", "telegram:-1001"
    await store.save(session(old, "hello"))
    await record_move(state, old, new)
    await record_move(state, old, new)  # (both service messages: recorded once)
    await carry_moves(state, store, None, inbox_dir=tmp_path / "inbox")
    moved = await store.load(new)
    assert moved is not None and [m.content for m in moved.messages] == ["hello"]
    await store.save(session(old, "hello"))  # as a kill before the delete left it
    await record_move(state, old, new)
    await carry_moves(state, store, None, inbox_dir=tmp_path / "inbox")
    assert await store.load(old) is None
    again = await store.load(new)
    assert again is not None and [m.content for m in again.messages] == ["hello"]


async def test_when_the_new_chat_has_a_conversation_both_are_kept_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """(``allowed_groups = ["*"]``: the supergroup was answered before the restart.)"""
    caplog.set_level(logging.WARNING)
    store, state = JsonSessionStore(tmp_path / "sessions"), tmp_path / "state"
    old, new = "telegram:-1", "telegram:-1001"
    await store.save(session(old, "the old group's"))
    await store.save(session(new, "the supergroup's"))
    await record_move(state, old, new)
    await carry_moves(state, store, None, inbox_dir=tmp_path / "inbox")
    kept_old, kept_new = await store.load(old), await store.load(new)
    assert kept_old is not None and [m.content for m in kept_old.messages] == ["the old group's"]
    assert kept_new is not None and [m.content for m in kept_new.messages] == ["the supergroup's"]
    assert any(isinstance(r.msg, dict) and r.msg["event"] == "session_move_conflict" for r in caplog.records)


async def test_answers_the_groups_log_saved_go_along_when_the_supergroup_has_a_conversation(
    tmp_path: Path,
) -> None:
    """Killed between saving the group's answer and sending it, while the supergroup had a session of its
    own: the answer stayed in the old session's log, its message went on pending under the new id, and
    the start asked the model again (a second, different answer). Now it is added to the new session's
    log (one append; a repeat after a kill finds its id there and adds nothing) and sent as it was."""
    store, state, inbox_dir = JsonSessionStore(tmp_path / "sessions"), tmp_path / "state", tmp_path / "inbox"
    old, new = "telegram:-1", "telegram:-1001"
    inbox = Inbox(inbox_dir)
    await inbox.load_pending()
    asked, durable = inbox.add(InboundMessage("telegram", "-1", "42", "asked", message_id="5", is_group=True))
    await durable
    saved = PendingReply("telegram", "-1", "the answer made once", (asked,), reply_to="5")
    await store.save(session(old, "asked", "the answer made once"), replies=[saved])
    await store.save(session(new, "the supergroup's"))
    for _ in range(2):  # (the second: as a start after a kill before the move was forgotten)
        await record_move(state, old, new)
        await carry_moves(state, store, None, inbox_dir=inbox_dir)

    assert [(r.id, r.chat_id, r.text) for r in await store.replies(new)] == [
        (saved.id, "-1001", "the answer made once")
    ]
    kept_new = await store.load(new)
    assert kept_new is not None and [m.content for m in kept_new.messages] == ["the supergroup's"]
    work = await recover(Inbox(inbox_dir), SessionService(store), max_age=0)
    assert [(type(w).__name__, getattr(w, "id", None)) for w in work[new]] == [("PendingReply", saved.id)]


async def test_a_turn_a_kill_cut_in_the_group_does_not_run_its_tool_calls_again_in_the_supergroup(
    tmp_path: Path,
) -> None:
    """The message goes on pending under the new id and is answered again from the start there: the
    calls its turn made (a shell command, an ``append``) are answered from the journal, not run again."""
    store, state, inbox_dir = JsonSessionStore(tmp_path / "sessions"), tmp_path / "state", tmp_path / "inbox"
    old, new = "telegram:-1", "telegram:-1001"
    inbox = Inbox(inbox_dir)
    await inbox.load_pending()
    _, durable = inbox.add(InboundMessage("telegram", "-1", "42", "note it", message_id="5", is_group=True))
    await durable
    journal = ToolJournal.of(state)
    call = ("files", '{"action": "append"}', 1)
    await journal.keep(old, "5", call, "Appended.")
    await record_move(state, old, new)

    await carry_moves(state, store, None, inbox_dir=inbox_dir)

    pending = await Inbox(inbox_dir).load_pending()
    assert [(e.message.session_id, e.message.message_id) for e in pending] == [(new, "5")]
    assert await ToolJournal.of(state).made(new, "5") == {call: "Appended."}


async def test_a_turn_a_kill_cut_in_the_group_keeps_its_tool_calls_where_the_supergroup_has_a_journal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The supergroup's last turn made a tool call and ended: its journal stays (stale) until its next
    turn's first call. That file kept the group's journal from moving, and the group's message, answered
    again under the new id, found the supergroup's stale turn there and ran its calls again. A stale one
    (no pending message of the new chat names it) is replaced now; a live one is kept and logged."""
    caplog.set_level(logging.WARNING)
    store, state, inbox_dir = JsonSessionStore(tmp_path / "sessions"), tmp_path / "state", tmp_path / "inbox"
    inbox = Inbox(inbox_dir)
    await inbox.load_pending()
    journal = ToolJournal.of(state)
    call = ("files", '{"action": "append"}', 1)
    for n in (1, 2):
        old, new = f"telegram:-{n}", f"telegram:-100{n}"
        _, durable = inbox.add(
            InboundMessage("telegram", f"-{n}", "42", "note it", message_id="5", is_group=True)
        )
        await durable
        await journal.keep(old, "5", call, "Appended.")
        await journal.keep(new, "9", ("shell", '{"command": "ls"}', 1), "a.txt")
        await record_move(state, old, new)
    # the second supergroup's turn was cut too: its message waits, and its journal is its own
    _, durable = inbox.add(InboundMessage("telegram", "-1002", "7", "list", message_id="9", is_group=True))
    await durable

    for _ in range(2):  # (the second: as a start after a kill before the moves were forgotten)
        await carry_moves(state, store, None, inbox_dir=inbox_dir)
        await record_move(state, "telegram:-1", "telegram:-1001")

    assert await ToolJournal.of(state).made("telegram:-1001", "5") == {call: "Appended."}
    assert not journal.path_for("telegram:-1").exists()
    assert journal.path_for("telegram:-2").exists()  # (both live: both kept, as before)
    conflicts = [r.msg for r in caplog.records if isinstance(r.msg, dict)]
    assert {m["old_session"] for m in conflicts if m["event"] == "session_move_conflict"} == {"telegram:-2"}


FACT = "User flies to Lisbon on May 3rd"
CONSOLIDATION = json.dumps(
    {
        "history_entry": "We planned the Lisbon trip.",
        "memory_update": f"- {FACT}\n",
        "items": [{"type": "fact", "content": FACT, "confidence": 0.9}],
    }
)


async def test_a_consolidation_a_kill_cut_in_the_group_is_finished_as_the_supergroups(tmp_path: Path) -> None:
    """The group's retirement was recorded, and a kill came before its consolidation: resumed at the
    start, it was started before the move was carried, and what it wrote after named the old id (the
    fact out of the supergroup's recall, a MEMORY.md in a folder no chat reads)."""
    workspace = tmp_path / "ws"
    old, new = f"telegram:{OLD}", f"telegram:{NEW}"
    talk = [Message(Role.USER if i % 2 == 0 else Role.ASSISTANT, f"Lisbon trip, part {i}") for i in range(4)]
    pending = workspace / "memory" / "pending"
    await asyncio.to_thread(pending.mkdir, parents=True)
    await PendingConsolidations(pending).add(old, talk, utcnow())
    await asyncio.to_thread((workspace / "state").mkdir)
    await record_move(workspace / "state", old, new)
    answered = asyncio.Event()
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(text=CONSOLIDATION, hold=answered))
        async with membot_run(workspace, llm, **group_env(tg, NEW)) as service:
            answered.set()  # (once the start is over: the move was carried by then)
            async with asyncio.timeout(30):
                while list(pending.iterdir()):
                    await asyncio.sleep(0.02)
            await stop(service)
    items = ItemStore(workspace / "memory" / "items", per_chat=True)
    await items.load()
    assert {ref.session_id for item in items.items() if item.content == FACT for ref in item.references} == {
        new
    }
    chats = workspace / "memory" / "chats"
    assert not (chats / encode_id(old)).exists()
    assert FACT in (chats / encode_id(new) / "MEMORY.md").read_text()
    assert not (workspace / "memory" / "archive" / f"{encode_id(old)}.jsonl").exists()


async def test_a_move_a_full_disk_refuses_stops_the_start_with_the_fix_and_waits_for_the_next(
    tmp_path: Path,
) -> None:
    """A write of the move refused (here every write past 16 KiB of a file, as a full disk refuses it):
    ``membot run`` ended with a bare ``error: File too large`` (no file named, no JSON line, exit 1,
    which the systemd unit restarts into the same failure). Now it is the start's error, exit 78, with
    the place and the fix; the move stays recorded, and a start that can write finishes it."""
    workspace = tmp_path / "ws"
    old, new = f"telegram:{OLD}", f"telegram:{NEW}"
    long = "the long message " * 4000  # (68 KB: its move is one write past the limit)
    inbox = Inbox(workspace / "inbox")
    await inbox.load_pending()
    _, durable = inbox.add(InboundMessage("telegram", str(OLD), "42", long, message_id="5", is_group=True))
    await durable
    await record_move(workspace / "state", old, new)
    old_file = inbox.file(old)
    lines = old_file.read_bytes()
    env = {
        "HOME": str(tmp_path),
        "MEMBOT_WORKSPACE": str(workspace),
        "MEMBOT_LOG_FORMAT": "json",
        "MEMBOT_LLM__OPENAI__API_KEY": "sk-x",
        "MEMBOT_TERMINAL__ENABLED": "true",
    }

    result = await asyncio.to_thread(run_membot, "run", env=env, cwd=tmp_path, max_file_bytes=16 * 1024)

    assert result.returncode == 78, result.stderr
    last = json.loads(result.stderr.splitlines()[-1])
    assert last["event"] == "membot_start_failed" and "Traceback" not in result.stderr, result.stderr
    error = str(last["error"])
    assert f"cannot move chat {old} to {new}" in error and str(workspace / "inbox") in error, error
    assert "Free disk space" in error and str(workspace / "state" / MOVES_FILE) in error, error
    assert old_file.read_bytes() == lines  # nothing lost, nothing moved half
    assert json.loads((workspace / "state" / MOVES_FILE).read_text()) == {old: new}
    await carry_moves(
        workspace / "state", JsonSessionStore(workspace / "sessions"), None, inbox_dir=workspace / "inbox"
    )
    pending = await Inbox(workspace / "inbox").load_pending()
    assert [(e.message.session_id, e.message.text) for e in pending] == [(new, long)]


async def test_a_wait_for_the_model_moves_once_and_a_new_chats_own_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The old chat's wait record is the new id's (a repeat after a kill changes nothing); where the new
    chat waits too, both records are left and the conflict logged."""
    caplog.set_level(logging.WARNING)
    store, state = JsonSessionStore(tmp_path / "sessions"), tmp_path / "state"
    waits = WaitRecords(state / WAIT_FILE)
    await waits.begin("telegram:-1", ["e1"])
    await waits.begin("telegram:-2", ["e2"])
    await waits.begin("telegram:-1002", ["e3"])
    await record_move(state, "telegram:-1", "telegram:-1001")
    await record_move(state, "telegram:-2", "telegram:-1002")
    for _ in range(2):  # (the second: as a start after a kill before the moves were forgotten)
        await carry_moves(state, store, None, inbox_dir=tmp_path / "inbox")
        await record_move(state, "telegram:-1", "telegram:-1001")
    records = await WaitRecords(state / WAIT_FILE).load()
    assert {sid: set(r.entries) for sid, r in records.items()} == {
        "telegram:-1001": {"e1"},
        "telegram:-2": {"e2"},
        "telegram:-1002": {"e3"},
    }
    conflicts = [r.msg for r in caplog.records if isinstance(r.msg, dict)]
    assert [m["old_session"] for m in conflicts if m["event"] == "session_move_conflict"] == ["telegram:-2"]
