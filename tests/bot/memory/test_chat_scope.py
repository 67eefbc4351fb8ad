"""memory.scope = "chat": what one chat says never reaches another chat's prompt; MEMORY.md stays shared."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from structlog.testing import capture_logs

from bot.config import MemorySettings, ToolSettings
from bot.domain import Message, Role
from bot.llm import LLMClient
from bot.memory import Exchange, MemoryService
from bot.memory import operator as memory_operator
from bot.memory.relevant import SEMANTIC_CANDIDATES
from bot.memory.tool import MemoryTool
from bot.session_names import encode_id
from bot.tools import builtin_tools
from bot.tools.base import ToolContext, ToolError
from tests.bot.memory.conftest import Clock, make_memory
from tests.bot.memory.test_vectors import WordsEmbedder
from tests.fakes.llm_server import FakeLLMServer, FakeReply

A, B = "telegram:111", "discord:222"
OPERATOR = "# Operator\n- The office is in Porto\n"
FACT = "Remember that my passport number ends in 42."


def exchange(clock: Clock, sid: str, user: str, answer: str = "Noted.") -> Exchange:
    return Exchange(
        sid,
        Message(Role.USER, user, timestamp=clock.now),
        Message(Role.ASSISTANT, answer, timestamp=clock.now),
    )


def files_under(root: Path) -> set[Path]:
    """Every file but the lock files beside each MEMORY.md (empty; they only coordinate writers)."""
    return {p.resolve() for p in root.rglob("*") if p.is_file() and not p.name.endswith(".lock")}


def chat_dir(memory: MemoryService, sid: str) -> Path:
    return memory.root / "chats" / encode_id(sid)


async def chat_memory(tmp_path: Path, clock: Clock, llm: LLMClient | None = None) -> MemoryService:
    memory = await make_memory(tmp_path, clock, llm, scope="chat")
    (memory.root / "MEMORY.md").write_text(OPERATOR)
    return memory


async def test_a_fact_told_in_one_chat_stays_in_that_chat(tmp_path: Path, clock: Clock) -> None:
    memory = await chat_memory(tmp_path, clock)
    stored = await memory.record_exchanges([exchange(clock, A, FACT)])
    assert stored and all(any(r.session_id == A for r in i.references) for i in stored)
    await MemoryTool(memory).run(
        {"action": "add", "content": "User's cat is called Miso", "layer": "long_term"},
        ToolContext(A, "telegram", "t1"),
    )

    mine = await memory.context("what does my passport number end in? and my cat?", session_id=A)
    theirs = await memory.context("what does my passport number end in? and my cat?", session_id=B)

    assert "## Long-term Memory\n# Operator\n- The office is in Porto" in mine.text
    assert "## This Chat's Memory\n- User's cat is called Miso" in mine.text
    assert "## Relevant Memory" in mine.text and mine.pack.items
    assert mine.text.count("passport number ends in 42") == 1  # in the pack, so not again in the notes
    assert "## Long-term Memory\n# Operator\n- The office is in Porto" in theirs.text
    assert "42" not in theirs.text and "Miso" not in theirs.text and not theirs.pack.items
    assert "## This Chat's Memory" not in theirs.text and "Today's Notes" not in theirs.text
    # Nothing of the chat went to the workspace files the other chats read.
    assert (memory.root / "MEMORY.md").read_text() == OPERATOR
    assert [p.name for p in memory.root.glob("*.md")] == ["MEMORY.md"]  # no workspace daily notes
    assert (chat_dir(memory, A) / "2024-05-20.md").read_text().startswith("[09:30] User: Remember")


async def test_search_is_per_chat_and_the_operator_sees_all(tmp_path: Path, clock: Clock) -> None:
    memory = await chat_memory(tmp_path, clock)
    await memory.record_exchanges([exchange(clock, A, FACT)])
    await memory.record_exchanges([exchange(clock, B, "Remember that my locker number is 42.")])

    mine = await memory.search("passport number 42", session_id=A)
    theirs = await memory.search("passport number 42", session_id=B)
    everyone = await memory.search("passport number 42")

    assert mine and all(any(r.session_id == A for r in s.item.references) for s in mine)
    assert not any("passport" in s.item.content for s in theirs)
    assert {r.session_id for s in everyone for r in s.item.references} == {A, B}
    stats_a = await memory_operator.stats(memory, session_id=A)
    stats_none = await memory_operator.stats(memory, session_id="telegram:999")
    assert stats_a.today_notes == 1 and sum(stats_a.items.values()) > 0
    assert stats_none.today_notes == 0 and sum(stats_none.items.values()) == 0
    assert stats_none.memory_md_bytes == 0


async def test_consolidation_writes_the_chats_memory_never_the_operators(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    memory = await chat_memory(tmp_path, clock, llm)
    before = (memory.root / "MEMORY.md").read_bytes()
    await memory.chats.longterm(A).update(lambda _: "- A's user drinks green tea\n")
    update = "- A's user drinks green tea\n- A's user is going to Lisbon in June\n"
    fake_llm.script(FakeReply(text=json.dumps({"history_entry": "Planned a trip.", "memory_update": update})))
    conversation = [
        Message(Role.USER, "I fly to Lisbon in June", timestamp=clock.now),
        Message(Role.ASSISTANT, "Have a good trip!", timestamp=clock.now),
    ]

    result = await memory.consolidate(A, conversation, timeout=5)

    assert result.memory_changed and not result.raw_fallback
    prompt = json.dumps(fake_llm.requests[-1].body)
    assert "green tea" in prompt and "The office is in Porto" not in prompt  # the chat's file is "current"
    assert (memory.root / "MEMORY.md").read_bytes() == before
    assert (chat_dir(memory, A) / "MEMORY.md").read_text() == update
    assert "Planned a trip." in (memory.root / "HISTORY.md").read_text()  # the operator's log stays one
    mine = await memory.context("where am I going?", session_id=A)
    theirs = await memory.context("where am I going?", session_id=B)
    assert "Lisbon" in mine.text and "The office is in Porto" in mine.text
    assert "Lisbon" not in theirs.text and "green tea" not in theirs.text
    assert "The office is in Porto" in theirs.text


async def test_the_memory_tool_sees_only_its_own_chat(memory_chat: MemoryService) -> None:
    tool = MemoryTool(memory_chat)
    ctx_a, ctx_b = ToolContext(A, "telegram", "t1"), ToolContext(B, "discord", "t2")
    saved = await tool.run({"action": "add", "content": "User's dog is called Rex", "type": "fact"}, ctx_a)
    item_id = saved.split()[2]
    item = memory_chat.items.get(item_id)
    assert item is not None and [r.session_id for r in item.references] == [A]

    assert "Rex" in await tool.run({"action": "search", "query": "what is the dog called"}, ctx_a)
    assert await tool.run({"action": "search", "query": "what is the dog called"}, ctx_b) == (
        "No matching memories."
    )
    for args in (
        {"action": "update", "id": item_id, "content": "User's dog is called Max"},
        {"action": "promote", "id": item_id},
        {"action": "forget", "id": item_id},
    ):
        with pytest.raises(ToolError, match="no memory with id"):
            await tool.run(args, ctx_b)
    assert memory_chat.items.get(item_id) == item

    await tool.run({"action": "add", "content": "User is vegan", "layer": "long_term"}, ctx_b)
    assert await tool.run({"action": "forget", "content": "vegan"}, ctx_a) == "No MEMORY.md line matched."
    assert (chat_dir(memory_chat, B) / "MEMORY.md").read_text() == "- User is vegan\n"
    assert (memory_chat.root / "MEMORY.md").read_text() == OPERATOR


@pytest.mark.parametrize("sid", ["telegram:-100123:7", "../../etc", "..", "a/../../b", ".hidden", ""])
async def test_odd_session_ids_stay_inside_memory_chats(tmp_path: Path, clock: Clock, sid: str) -> None:
    memory = await chat_memory(tmp_path, clock)
    await memory.record_exchanges([exchange(clock, sid, FACT)])
    await memory.longterm_for(sid).update(lambda _: "- x\n")

    chats = (memory.root / "chats").resolve()
    folder = chat_dir(memory, sid).resolve()
    assert folder.parent == chats
    written = files_under(tmp_path)
    assert {p for p in written if not p.is_relative_to(memory.root.resolve() / "items")} == {
        (memory.root / "MEMORY.md").resolve(),
        folder / "MEMORY.md",
        folder / "2024-05-20.md",
    }
    assert "- x" in (await memory.context("", session_id=sid)).text


async def test_chat_folders_and_files_are_private(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    memory = await chat_memory(tmp_path, clock, llm)
    fake_llm.script(FakeReply(text=json.dumps({"history_entry": "x", "memory_update": "- y\n"})))
    await memory.record_exchanges([exchange(clock, A, FACT)])
    await memory.consolidate(A, [Message(Role.USER, "hello", timestamp=clock.now)], timeout=5)

    chats = memory.root / "chats"
    assert chats.stat().st_mode & 0o777 == 0o700
    assert {p.name for p in chat_dir(memory, A).iterdir()} == {
        ".MEMORY.md.lock",
        "MEMORY.md",
        "2024-05-20.md",
    }
    for path in chats.rglob("*"):
        assert path.stat().st_mode & 0o777 == (0o700 if path.is_dir() else 0o600), path


async def test_render_for_session_shows_that_chats_memory(tmp_path: Path, clock: Clock) -> None:
    memory = await chat_memory(tmp_path, clock)
    await memory.record_exchanges([exchange(clock, A, FACT)])
    history = [Message(Role.USER, "what does my passport number end in?")]

    mine = await memory_operator.render_for_session(memory, "You are membot.", history, session_id=A)
    theirs = await memory_operator.render_for_session(memory, "You are membot.", history, session_id=B)
    nobody = await memory_operator.render_for_session(memory, "You are membot.", history)

    assert "ends in 42" in mine
    assert "ends in 42" not in theirs and "ends in 42" not in nobody
    assert "The office is in Porto" in theirs and "The office is in Porto" in nobody


async def test_files_tool_cannot_open_memory_in_chat_scope(tmp_path: Path) -> None:
    (tmp_path / "memory" / "chats" / "x").mkdir(parents=True)
    (tmp_path / "memory" / "chats" / "x" / "2024-05-20.md").write_text("secret\n")
    async with httpx.AsyncClient() as http:
        tools = builtin_tools(
            ToolSettings(), workspace=tmp_path, timezone="UTC", http=http, private_memory=True
        )
    files = next(t for t in tools if t.name == "files")
    ctx = ToolContext(A, "telegram", "t1")
    for args in (
        {"action": "read", "path": "memory/chats/x/2024-05-20.md"},
        {"action": "read", "path": "memory/MEMORY.md"},
        {"action": "write", "path": "memory/MEMORY.md", "content": "- z\n"},
        {"action": "list", "path": "memory"},
    ):
        with pytest.raises(ToolError, match="internal state"):
            await files.run(args, ctx)
    assert "memory" not in await files.run({"action": "list", "path": "."}, ctx)


@pytest.fixture
async def memory_chat(tmp_path: Path, clock: Clock) -> AsyncIterator[MemoryService]:
    memory = await chat_memory(tmp_path, clock)
    yield memory
    await memory.close()


async def say_much_else(memory: MemoryService, clock: Clock, sid: str) -> None:
    """``sid`` says enough about other things to hold most of the items."""
    others = len(memory.items) - len(memory.items.index.of_session(sid))
    await memory.record_exchanges(
        [exchange(clock, sid, f"Gardening note {n}: tomatoes and basil.", f"Ok {n}.") for n in range(others)]
    )
    assert len(memory.items.index.of_session(sid)) * 2 > len(memory.items)


@pytest.mark.parametrize("holds", ["few", "most"])
async def test_other_chats_memories_never_crowd_out_a_chats_own(
    tmp_path: Path, clock: Clock, holds: str
) -> None:
    """Retrieval's candidates are this chat's items: a bot with many users, all talking about coffee,
    still finds what this user said about it, however far down the whole memory's ranking it is; also
    when this chat holds most of the items (a bot's main user, a few guests)."""
    memory = await chat_memory(tmp_path, clock)
    await memory.record_exchanges([exchange(clock, A, "I take my coffee with oat milk.")])
    crowd = memory.retriever.weights.candidates + 50
    await memory.record_exchanges(
        [
            exchange(clock, f"discord:{n}", f"Coffee, coffee, coffee: espresso coffee number {n}.")
            for n in range(crowd)
        ]
    )
    if holds == "most":
        await say_much_else(memory, clock, A)
    await memory.close()
    memory = await chat_memory(tmp_path, clock)  # a start: the index's base holds everything

    found = await memory.search("coffee?", session_id=A)

    assert [s.item.content for s in found][:1] == ["I take my coffee with oat milk."]


@pytest.mark.parametrize("holds", ["few", "most"])
async def test_other_chats_memories_never_crowd_out_a_chats_own_in_meaning(
    tmp_path: Path, clock: Clock, holds: str
) -> None:
    """The same for the embedding signal: its nearest items are drawn from this chat's."""
    settings = MemorySettings.model_validate({"scope": "chat"})
    memory = MemoryService(
        # Wide enough that no word of the chat's other talk shares the query's dimensions by chance.
        tmp_path / "memory",
        settings,
        timezone="UTC",
        clock=clock,
        embedder=WordsEmbedder(dim=4096),
    )
    await memory.start()
    await memory.record_exchanges([exchange(clock, A, "We adopted a puppy named Biscuit.")])
    crowd = SEMANTIC_CANDIDATES + 50
    await memory.record_exchanges(
        [exchange(clock, f"discord:{n}", f"My dog is great, dog number {n}.") for n in range(crowd)]
    )
    if holds == "most":
        await say_much_else(memory, clock, A)
    assert memory.vectors is not None
    await memory.vectors.drain()

    found = await memory.search("how is the dog?", session_id=A)

    assert "We adopted a puppy named Biscuit." in [s.item.content for s in found]
    await memory.close()


ADOPTED = "I adopted a dog last spring."


async def test_the_same_words_in_two_chats_never_show_one_chats_message_to_the_other(
    tmp_path: Path, clock: Clock
) -> None:
    memory = await chat_memory(tmp_path, clock)
    await memory.record_exchanges([exchange(clock, A, f"{ADOPTED} My doctor is Dr. Quill, SSN 078-05-1120.")])
    clock.advance(days=1)
    await memory.record_exchanges([exchange(clock, B, f"{ADOPTED} What should I feed it?")])
    clock.advance(days=1)

    theirs = await memory.context("when did I adopt my dog?", session_id=B)
    mine = await memory.context("when did I adopt my dog?", session_id=A)

    assert "feed it" in theirs.text and "Quill" not in theirs.text and "078-05" not in theirs.text
    assert "Quill" in mine.text and "feed it" not in mine.text
    # The shared sentence is an item per chat, each naming only its own chat.
    said = [i for i in memory.items.items() if i.content == ADOPTED]
    assert sorted(r.session_id for i in said for r in i.references) == sorted([A, B])
    assert all(len({r.session_id for r in i.references}) == 1 for i in said)


async def test_one_chat_changing_or_forgetting_what_both_said_leaves_the_others(
    memory_chat: MemoryService, clock: Clock
) -> None:
    tool = MemoryTool(memory_chat)
    ctx_a, ctx_b = ToolContext(A, "telegram", "t1"), ToolContext(B, "discord", "t2")
    for sid in (A, B):
        await memory_chat.record_exchanges([exchange(clock, sid, "I have a cat.")])
    cats = {
        r.session_id: i
        for i in memory_chat.items.items()
        if i.content == "I have a cat."
        for r in i.references
    }
    theirs = cats[B]

    update = {"action": "update", "id": theirs.id, "content": "I have a cat; my vet is Dr. Quill."}
    await tool.run(update, ctx_b)
    assert "Quill" not in await tool.run({"action": "search", "query": "cat"}, ctx_a)
    await tool.run({"action": "forget", "id": theirs.id}, ctx_b)

    assert "I have a cat." in await tool.run({"action": "search", "query": "cat"}, ctx_a)
    assert memory_chat.items.get(cats[A].id) == cats[A] and memory_chat.items.get(theirs.id) is None


async def test_items_merged_across_chats_before_are_split_by_chat_at_start(
    tmp_path: Path, clock: Clock
) -> None:
    shared = await make_memory(tmp_path, clock)  # workspace scope: the same words are one item
    await shared.record_exchanges([exchange(clock, A, f"{ADOPTED} My doctor is Dr. Quill.")])
    await shared.record_exchanges([exchange(clock, B, f"{ADOPTED} What should I feed it?")])
    (merged,) = [i for i in shared.items.items() if i.content == ADOPTED]
    assert [r.session_id for r in merged.references] == [A, B]
    await shared.close()

    memory = await make_memory(tmp_path, clock, scope="chat")
    said = {r.session_id: i for i in memory.items.items() if i.content == ADOPTED for r in i.references}
    theirs = await memory.context("when did I adopt my dog?", session_id=B)
    await memory.close()
    again = await make_memory(tmp_path, clock, scope="chat")  # the split was written, once

    assert said[A].id == merged.id and said[B].id != merged.id
    assert [r.session_id for r in said[A].references] == [A]
    assert [r.session_id for r in said[B].references] == [B]
    assert "feed it" in theirs.text and "Quill" not in theirs.text
    assert await again.items.separate_chats() == 0
    assert sorted(i.id for i in again.items.items() if i.content == ADOPTED) == sorted(
        [merged.id, said[B].id]
    )


async def test_a_newer_statement_in_another_chat_never_shows_as_a_chats_current_one(
    tmp_path: Path, clock: Clock
) -> None:
    memory = await chat_memory(tmp_path, clock)
    await memory.record_exchanges([exchange(clock, A, "I live in Paris, near the Canal Saint-Martin.")])
    clock.advance(days=3)
    await memory.record_exchanges([exchange(clock, B, "I moved to Berlin, Kreuzberg, last spring.")])
    clock.advance(days=1)

    mine = await memory.context("where do I live?", session_id=A)
    theirs = await memory.context("where do I live?", session_id=B)

    assert "Canal Saint-Martin" in mine.text and "Kreuzberg" not in mine.text
    assert "Kreuzberg" in theirs.text and "Canal Saint-Martin" not in theirs.text


async def test_switching_to_chat_scope_warns_that_the_bots_memory_md_is_now_shown_to_every_chat(
    tmp_path: Path, clock: Clock
) -> None:
    shared = await make_memory(tmp_path, clock)  # workspace scope: the bot writes MEMORY.md
    await shared.record_exchanges([exchange(clock, A, FACT)])
    await MemoryTool(shared).run(
        {"action": "add", "content": "User's cat is called Miso", "layer": "long_term"},
        ToolContext(A, "telegram", "t1"),
    )
    await shared.close()

    with capture_logs() as switched:
        memory = await make_memory(tmp_path, clock, scope="chat")
        await memory.close()
    with capture_logs() as later:
        again = await make_memory(tmp_path, clock, scope="chat")
        await again.close()

    (warning,) = [e for e in switched if e["event"] == "memory_scope_now_chat"]
    assert warning["log_level"] == "warning" and warning["path"].endswith("memory/MEMORY.md")
    assert "Miso" in (tmp_path / "memory" / "MEMORY.md").read_text()  # left as it is: the operator's
    assert not [e for e in later if e["event"] == "memory_scope_now_chat"]  # once


async def test_a_new_workspace_in_chat_scope_with_the_operators_memory_md_starts_quietly(
    tmp_path: Path, clock: Clock
) -> None:
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "MEMORY.md").write_text(OPERATOR)  # the operator's, before the first start
    with capture_logs() as logs:
        memory = await make_memory(tmp_path, clock, scope="chat")
        await memory.record_exchanges([exchange(clock, A, FACT)])
        await memory.close()
        again = await make_memory(tmp_path, clock, scope="chat")  # items now, but in chat scope
        await again.close()

    assert not [e for e in logs if e["event"] == "memory_scope_now_chat"]
