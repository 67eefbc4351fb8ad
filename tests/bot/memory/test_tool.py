"""The memory tool: add, search, update, promote, forget — on items and on MEMORY.md."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from bot.domain import Message, Role
from bot.memory import Exchange, Layer, MemoryService
from bot.memory.tool import MemoryTool
from bot.tools.base import ToolContext, ToolError
from tests.bot.memory.conftest import Clock, make_memory

CTX = ToolContext("cli:me", "cli", "turn1")
# Loaded at import (ZoneInfo caches it): reading tzdata inside a test's event loop is blocking I/O.
ZoneInfo("America/Los_Angeles")


async def test_add_search_update_forget_items(memory: MemoryService) -> None:
    tool = MemoryTool(memory)
    saved = await tool.run({"action": "add", "content": "User's cat is called Miso", "type": "fact"}, CTX)
    item_id = saved.split()[2]
    item = memory.items.get(item_id)
    assert item is not None and item.layer is Layer.SEMANTIC and item.references[0].session_id == "cli:me"

    found = await tool.run({"action": "search", "query": "what is the cat called"}, CTX)
    assert item_id in found and "Miso" in found

    assert await tool.run({"action": "update", "id": item_id, "content": "User's cat is called Mochi"}, CTX)
    assert "Mochi" in await tool.run({"action": "search", "query": "cat"}, CTX)

    assert await tool.run({"action": "forget", "id": item_id}, CTX) == f"Forgot {item_id}."
    assert await tool.run({"action": "search", "query": "cat"}, CTX) == "No matching memories."


async def test_search_dates_what_it_finds_in_the_configured_time_zone(tmp_path: Path) -> None:
    # 01:30 UTC on May 4th is the evening of May 3rd in California, as the notes and the pack say.
    clock = Clock(datetime(2024, 5, 4, 1, 30, tzinfo=UTC))
    memory = await make_memory(tmp_path, clock, timezone="America/Los_Angeles")
    tool = MemoryTool(memory)
    await tool.run({"action": "add", "content": "User's cat is called Miso", "type": "fact"}, CTX)
    found = await tool.run({"action": "search", "query": "what is the cat called"}, CTX)
    await memory.close()
    assert "/fact, 2024-05-03] User's cat is called Miso" in found


async def test_long_term_add_and_forget_go_through_memory_md(memory: MemoryService) -> None:
    tool = MemoryTool(memory)
    (memory.root / "MEMORY.md").write_text("# Operator notes\n- keep answers short\n")
    assert await tool.run({"action": "add", "content": "User lives in Porto", "layer": "long_term"}, CTX)
    await tool.run(
        {"action": "add", "content": "User lives in Porto", "layer": "long_term"}, CTX
    )  # no repeat
    assert (
        memory.root / "MEMORY.md"
    ).read_text() == "# Operator notes\n- keep answers short\n- User lives in Porto\n"
    assert (
        await tool.run({"action": "forget", "content": "porto"}, CTX) == "Removed 1 line(s) from MEMORY.md."
    )
    assert (memory.root / "MEMORY.md").read_text() == "# Operator notes\n- keep answers short\n"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            {"action": "add", "content": {"fact": "User likes tea"}},
            "'content' must be a string, not a JSON object",
        ),
        ({"action": "add", "content": ["User likes tea"], "layer": "long_term"}, "not a JSON array"),
        ({"action": "search", "query": {"q": "tea"}}, "'query' must be a string, not a JSON object"),
    ],
)
async def test_an_argument_that_is_no_text_is_refused_not_stored_as_its_python_text(
    memory: MemoryService, args: dict[str, object], said: str
) -> None:
    """A JSON object or list as ``content`` was stored as its Python text ("{'fact': 'x'}")."""
    tool = MemoryTool(memory)
    with pytest.raises(ToolError, match=re.escape(said)):
        await tool.run(args, CTX)
    assert memory.items.items() == []
    assert not (memory.root / "MEMORY.md").exists() or "fact" not in (memory.root / "MEMORY.md").read_text()


@pytest.mark.parametrize("content", ["-", "- ", " * ", "..."])
async def test_forget_by_content_without_a_word_removes_nothing(memory: MemoryService, content: str) -> None:
    """ "-" matched, as a whole word, the one line holding " - ": "likes tea - green" was removed."""
    tool = MemoryTool(memory)
    path = memory.root / "MEMORY.md"
    text = "- likes tea - green\n- lives in Berlin\n"
    await asyncio.to_thread(path.write_text, text)
    with pytest.raises(ToolError, match=r"the words of the MEMORY\.md line"):
        await tool.run({"action": "forget", "content": content}, CTX)
    assert await asyncio.to_thread(path.read_text) == text


async def test_forget_by_content_removes_the_line_that_says_it_never_every_line_holding_the_letters(
    memory: MemoryService,
) -> None:
    tool = MemoryTool(memory)
    text = "# Work\n- Works at Steam\n- Team lead: Ann Steadman\n- Likes green tea\n- Drinks tea at 5\n"
    path = memory.root / "MEMORY.md"
    await asyncio.to_thread(path.write_text, text)

    with pytest.raises(ToolError, match=r"2 MEMORY\.md lines mention 'tea' .*nothing was removed"):
        await tool.run({"action": "forget", "content": "tea"}, CTX)
    assert await asyncio.to_thread(path.read_text) == text
    assert await tool.run({"action": "forget", "content": "- likes green TEA"}, CTX) == (
        "Removed 1 line(s) from MEMORY.md."
    )
    assert await tool.run({"action": "forget", "content": "at 5"}, CTX) == "Removed 1 line(s) from MEMORY.md."
    assert await tool.run({"action": "forget", "content": "stead"}, CTX) == "No MEMORY.md line matched."
    assert await asyncio.to_thread(path.read_text) == "# Work\n- Works at Steam\n- Team lead: Ann Steadman\n"


async def test_search_finds_the_memory_md_lines_a_long_file_does_not_show(memory: MemoryService) -> None:
    """The bot adds at the end of MEMORY.md, and only its first ``inject_max_bytes`` are shown: what it
    added to a long file could be found nowhere, though the truncation notice says search finds it."""
    tool = MemoryTool(memory)
    filler = "".join(f"- operator note {i}: keep the weekly report short and friendly\n" for i in range(200))
    await asyncio.to_thread((memory.root / "MEMORY.md").write_text, filler)
    await tool.run(
        {"action": "add", "content": "User's locker combination is 7319", "layer": "long_term"}, CTX
    )

    shown = (await memory.context("hello")).text
    found = await tool.run({"action": "search", "query": "what is my locker combination?"}, CTX)

    assert "7319" not in shown and "can be searched with the memory tool" in shown
    assert found.splitlines()[0] == "[MEMORY.md] - User's locker combination is 7319"
    assert "operator note" not in found  # a line needs half of the query's words, not one


async def test_promote_moves_an_episode_to_the_durable_layer(memory: MemoryService, clock: Clock) -> None:
    user = Message(Role.USER, "I decided to use PostgreSQL for the project.", timestamp=clock.now)
    stored = await memory.record_exchanges([Exchange("cli:me", user, None)])
    decision = next(i for i in stored if i.type.value == "decision")
    answer = await MemoryTool(memory).run({"action": "promote", "id": decision.id}, CTX)
    assert answer.startswith(f"Promoted {decision.id} to semantic")
    assert any(i.content == decision.content for i in memory.items.items(Layer.SEMANTIC))


@pytest.mark.parametrize(
    "args",
    [
        {"action": "fly"},
        {"action": "add"},
        {"action": "update", "id": "nope", "content": "x"},
        {"action": "add", "content": "x", "type": "mood"},
        {"action": "forget"},
        {"action": "search"},
    ],
)
async def test_bad_arguments_are_tool_errors(memory: MemoryService, args: dict[str, str]) -> None:
    with pytest.raises(ToolError):
        await MemoryTool(memory).run(args, CTX)


@pytest.mark.parametrize("action", ["search", "search_archive"])
async def test_an_infinite_k_is_taken_as_no_count_given(memory: MemoryService, action: str) -> None:
    """``{"k": 1e999}`` is valid JSON to Python's reader, which makes it infinity: no crash, no traceback."""
    tool = MemoryTool(memory)
    await tool.run({"action": "add", "content": "User's cat is called Miso"}, CTX)
    found = await tool.run({"action": action, "query": "Miso", "k": float("inf")}, CTX)
    assert isinstance(found, str)


def test_schema_lists_every_action() -> None:
    assert MemoryTool.parameters["properties"]["action"]["enum"] == [
        "add",
        "search",
        "search_archive",
        "update",
        "promote",
        "forget",
    ]


@pytest.mark.parametrize("layer", ["semantic", "long_term"])
async def test_a_5mb_fact_is_refused_not_stored(memory: MemoryService, layer: str) -> None:
    tool = MemoryTool(memory)
    huge = "The user said: " + "blah " * 1_000_000
    with pytest.raises(ToolError, match="over the 1000-character limit"):
        await tool.run({"action": "add", "content": huge, "layer": layer}, CTX)
    assert not (memory.root / "MEMORY.md").exists() and memory.items.items(Layer.SEMANTIC) == []
    saved = await tool.run({"action": "add", "content": "User's cat is called Miso"}, CTX)
    with pytest.raises(ToolError, match="limit"):
        await tool.run({"action": "update", "id": saved.split()[2], "content": huge}, CTX)


async def test_memory_md_never_grows_past_its_hard_limit_through_the_bot(
    tmp_path: Path, clock: Clock
) -> None:
    memory = await make_memory(tmp_path, clock, max_memory_hard_size=2048)
    tool = MemoryTool(memory)
    operator = "".join(f"- operator fact {i}\n" for i in range(150))  # the operator may go past it
    await asyncio.to_thread((memory.root / "MEMORY.md").write_text, operator)
    with pytest.raises(ToolError, match="over its limit of 2048"):
        await tool.run({"action": "add", "content": "User lives in Porto", "layer": "long_term"}, CTX)
    assert await asyncio.to_thread((memory.root / "MEMORY.md").read_text) == operator
    # Shrinking is always allowed, and then adding again fits.
    for i in range(100, 150):
        await tool.run({"action": "forget", "content": f"operator fact {i}"}, CTX)
    assert "Saved" in await tool.run(
        {"action": "add", "content": "User lives in Porto", "layer": "long_term"}, CTX
    )
    await memory.close()
