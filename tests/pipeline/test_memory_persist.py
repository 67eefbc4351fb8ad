"""MemoryPersistSystem: notes and items after an answer; archive, trim and background consolidation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest

from bot.config import LLMSettings
from bot.domain import InboundMessage, Message, Role, Session, ToolCall
from bot.llm import LLMClient
from bot.memory import ItemType, Layer
from bot.sessions import JsonSessionStore
from pipeline.base import Turn
from pipeline.memory_persist import MemoryPersistSystem, safe_cut
from tests.bot.memory.conftest import CATALOG, Clock, make_memory
from tests.fakes.llm_server import FakeLLMServer, FakeReply

NOW = Clock().now


async def persist(system: MemoryPersistSystem, turn: Turn) -> None:
    """What the dispatcher does: run the system, then wait for the writes it left on the turn."""
    await system.process(turn)
    await asyncio.gather(*turn.writes)


def answered_turn(session: Session, user: str, answer: str) -> Turn:
    session.append(Message(Role.USER, user, timestamp=NOW))
    turn = Turn(session=session, inbound=(InboundMessage("cli", "me", "me", user),))
    turn.add_message(Message(Role.ASSISTANT, answer, timestamp=NOW))
    turn.reply = answer
    return turn


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLMServer]:
    async with FakeLLMServer() as server:
        yield server


@pytest.fixture
async def llm(fake_llm: FakeLLMServer) -> AsyncIterator[LLMClient]:
    base = {"openai": {"base_url": fake_llm.openai_base_url, "api_key": "sk-test"}, "max_retries": 0}
    async with httpx.AsyncClient() as http:
        yield LLMClient(LLMSettings.model_validate(base), CATALOG, http)


def history(session: Session, pairs: int) -> None:
    for i in range(pairs):
        session.append(Message(Role.USER, f"question {i}"))
        session.append(Message(Role.ASSISTANT, f"answer {i}"))


async def test_answered_turn_writes_note_and_items(tmp_path: Path) -> None:
    clock = Clock()
    memory = await make_memory(tmp_path, clock)
    system = MemoryPersistSystem(memory, memory.settings)
    session = Session.new("cli", "me")
    turn = answered_turn(session, "I prefer tea over coffee", "Noted, tea it is.")

    assert system.should_process(turn) and system.order == 50
    await persist(system, turn)

    note = (memory.root / "2024-05-20.md").read_text()
    assert "User: I prefer tea over coffee | Assistant: Noted, tea it is." in note
    user_id = session.messages[0].id
    assert any(i.references[0].message_id == user_id for i in memory.items.items(Layer.EPISODIC))
    # A preference said once stays episodic; said again in another turn, it becomes a durable fact.
    assert [
        i.type for i in memory.items.items(Layer.EPISODIC) if i.content == "I prefer tea over coffee"
    ] == [
        ItemType.EPISODE,
        ItemType.PREFERENCE,
    ]
    assert memory.items.items(Layer.SEMANTIC) == []
    await persist(system, answered_turn(session, "I prefer tea over coffee", "Still tea, then."))
    assert [i.content for i in memory.items.items(Layer.SEMANTIC)] == ["I prefer tea over coffee"]


async def test_unanswered_turn_is_skipped(tmp_path: Path) -> None:
    memory = await make_memory(tmp_path, Clock())
    session = Session.new("cli", "me")
    session.append(Message(Role.USER, "hi"))
    turn = Turn(session=session, inbound=())
    assert not MemoryPersistSystem(memory, memory.settings).should_process(turn)


async def test_over_the_window_archives_trims_and_consolidates_in_background(
    tmp_path: Path, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    clock = Clock()
    memory = await make_memory(tmp_path, clock, llm, memory_window=6, keep_recent=2)
    body = json.dumps({"history_entry": "Talked about questions.", "memory_update": "- asks questions\n"})
    fake_llm.script(FakeReply(text=body, delay=0.2))
    session = Session.new("cli", "me")
    history(session, 3)
    before = list(session.messages)
    turn = answered_turn(session, "question 3", "answer 3")

    await persist(MemoryPersistSystem(memory, memory.settings), turn)

    # The reply is not held up: the model call is still running when process() returns.
    assert memory.pending_consolidations == 1
    assert [m.content for m in session.messages] == ["question 3", "answer 3"]
    assert session.rewrite_needed
    archived = await memory.archive.read("cli:me")
    assert [m.id for m in archived] == [m.id for m in before]  # archived before it left the session

    await memory.close()
    assert "Talked about questions." in (memory.root / "HISTORY.md").read_text()
    assert (memory.root / "MEMORY.md").read_text() == "- asks questions\n"


async def test_window_zero_is_a_plain_trim_to_ten(tmp_path: Path, fake_llm: FakeLLMServer) -> None:
    memory = await make_memory(tmp_path, Clock(), memory_window=0)
    session = Session.new("cli", "me")
    history(session, 8)
    turn = answered_turn(session, "q", "a")

    await persist(MemoryPersistSystem(memory, memory.settings), turn)

    assert len(session.messages) == 10 and session.messages[-1].content == "a"
    assert memory.pending_consolidations == 0 and fake_llm.requests == []
    assert len(await memory.archive.read("cli:me")) == 8
    assert not (memory.root / "HISTORY.md").exists()


async def test_raw_fallback_still_trims(tmp_path: Path, llm: LLMClient, fake_llm: FakeLLMServer) -> None:
    memory = await make_memory(tmp_path, Clock(), llm, memory_window=4, keep_recent=2)
    fake_llm.script(FakeReply(status=500))
    session = Session.new("cli", "me")
    history(session, 2)
    await persist(MemoryPersistSystem(memory, memory.settings), answered_turn(session, "q", "a"))
    await memory.close()
    assert len(session.messages) == 2
    assert "[raw-fallback]" in (memory.root / "HISTORY.md").read_text()


def test_cut_never_separates_a_tool_call_from_its_results() -> None:
    call = ToolCall("c1", "time", "{}")
    messages = [
        Message(Role.USER, "what time is it"),
        Message(Role.ASSISTANT, "", tool_calls=(call,)),
        Message(Role.TOOL, "12:00", tool_call_id="c1", name="time"),
        Message(Role.TOOL, "12:00 again", tool_call_id="c1", name="time"),
        Message(Role.ASSISTANT, "noon"),
    ]
    assert safe_cut(messages, 3) == 1 and safe_cut(messages, 2) == 1
    assert safe_cut(messages, 4) == 4 and safe_cut(messages, 5) == 5 and safe_cut(messages, 0) == 0


async def test_items_name_their_conversation_which_a_new_session_or_a_quiet_gap_ends(tmp_path: Path) -> None:
    memory = await make_memory(tmp_path, Clock())
    system = MemoryPersistSystem(memory, memory.settings)
    session = Session.new("cli", "me")

    def talk(user: str, at: datetime) -> Turn:
        session.append(Message(Role.USER, user, timestamp=at))
        turn = Turn(session=session, inbound=(InboundMessage("cli", "me", "me", user),), now=at)
        turn.add_message(Message(Role.ASSISTANT, f"noted: {user}"))
        turn.reply = f"noted: {user}"
        return turn

    def conversation_of(text: str) -> str:
        return next(i.references[0].conversation for i in memory.items.items() if i.content == text)

    for text, at in [("first about tea", NOW), ("second about tea", NOW + timedelta(minutes=5))]:
        await persist(system, talk(text, at))
    assert conversation_of("first about tea") == conversation_of("second about tea") != ""
    await persist(system, talk("back after lunch hours later", NOW + timedelta(hours=5)))
    assert conversation_of("back after lunch hours later") != conversation_of("second about tea")
    session.replace_messages([])  # what /new leaves
    await persist(system, talk("a fresh start", NOW + timedelta(hours=5, minutes=1)))
    assert conversation_of("a fresh start") != conversation_of("back after lunch hours later")


async def test_a_kill_between_the_archive_and_the_session_save_archives_nothing_twice(
    tmp_path: Path,
) -> None:
    """The trim reached the archive but not the session file: the next start retires the same messages
    again, and the archive (which retrieval searches) holds each of them once."""
    store = JsonSessionStore(tmp_path / "sessions")
    session = Session.new("cli", "me")
    history(session, 8)
    await store.save(session)
    memory = await make_memory(tmp_path, Clock(), memory_window=0)
    await persist(MemoryPersistSystem(memory, memory.settings), answered_turn(session, "q", "a"))
    assert len(await memory.archive.read("cli:me")) == 8
    # Killed here: the session's save after the turn never ran (nor did memory.close()).

    restarted = await make_memory(tmp_path, Clock(), memory_window=0)
    loaded = await store.load("cli:me")
    assert loaded is not None and len(loaded.messages) == 16
    history(loaded, 2)  # and the chat went on: the next trim retires those 8 and 4 more
    await persist(MemoryPersistSystem(restarted, restarted.settings), answered_turn(loaded, "q2", "a2"))
    await restarted.close()

    ids = [m.id for m in await restarted.archive.read("cli:me")]
    assert len(ids) == len(set(ids)) == 12
    assert [m.content for m in loaded.messages][-2:] == ["q2", "a2"]
