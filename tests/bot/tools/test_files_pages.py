"""Long files through the files tool: read in pages, and never replaced from a view that was cut."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.catalog import load_catalog
from bot.config import LLMSettings, ToolSettings
from bot.domain import InboundMessage, Message, Role, Session
from bot.llm import LLMClient
from bot.memory.longterm import Limits, LongTermMemory
from bot.tools import ToolContext, ToolError, ToolRegistry, builtin_tools
from bot.tools.files import FilesTool
from bot.tools.paging import CUT_MARKER
from pipeline.base import Turn
from pipeline.tool_calls import cap
from pipeline.tool_loop import ToolLoopSystem
from tests.fakes.llm_server import FakeLLMServer, FakeReply

CATALOG = load_catalog()
CTX = ToolContext("test:chat", "test", "turn1")
FACTS = "".join(f"- fact number {i:03d}: the user mentioned something worth keeping\n" for i in range(600))


def body_of(result: str) -> str:
    """What a model copies out of a read: the text inside the untrusted block."""
    inner = result.split("</untrusted>")[0].split("\n", 2)[2]
    return inner[:-1] if inner.endswith("\n") else inner


async def run(files: FilesTool, **args: Any) -> str:
    return await files.run(args, CTX)


async def refused(files: FilesTool, **args: Any) -> str:
    with pytest.raises(ToolError) as info:
        await files.run(args, CTX)
    return str(info.value)


@pytest.fixture
async def server() -> AsyncIterator[FakeLLMServer]:
    async with FakeLLMServer() as fake:
        yield fake


async def test_memory_md_read_and_written_back_by_the_model_keeps_all_600_lines(
    tmp_path: Path, server: FakeLLMServer
) -> None:
    """The tester's case: a 600-line MEMORY.md read through the loop, then written back as seen."""
    workspace = tmp_path / "ws"
    memory_md = workspace / "memory" / "MEMORY.md"
    memory_md.parent.mkdir(parents=True)
    memory_md.write_text(FACTS)
    settings = ToolSettings.model_validate({"enabled": ["files"]})
    async with httpx.AsyncClient() as http:
        tools = builtin_tools(
            settings, workspace=workspace, timezone="UTC", http=http, long_term=LongTermMemory(memory_md)
        )

        def respond(api: str, body: dict[str, Any]) -> FakeReply:
            results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
            if not results:
                return FakeReply(tool_calls=[("files", {"action": "read", "path": "memory/MEMORY.md"})])
            if len(results) == 1:
                seen = body_of(results[0])
                return FakeReply(
                    tool_calls=[("files", {"action": "write", "path": "memory/MEMORY.md", "content": seen})]
                )
            return FakeReply(text="tidied")

        server.responder = respond
        llm = LLMClient(
            LLMSettings.model_validate(
                {"model": "gpt-4.1-mini", "openai": {"base_url": server.openai_base_url, "api_key": "k"}}
            ),
            CATALOG,
            http,
        )
        session = Session.new("test", "chat")
        session.append(Message(Role.USER, "tidy up your memory file"))
        turn = Turn(session=session, inbound=(InboundMessage("test", "chat", "u", "tidy"),), system_prompt="")
        await ToolLoopSystem(llm, ToolRegistry(tools, settings), settings).process(turn)

    results = [m.content for m in turn.session.messages if m.role is Role.TOOL]
    assert len(results) == 2 and len(results[0]) <= settings.result_max_chars  # never cut by the loop
    text = await asyncio.to_thread(memory_md.read_text)
    assert text == FACTS, f"{len(text.splitlines())} of 600 lines left"
    assert not CUT_MARKER.search(text)
    assert "read only part of memory/MEMORY.md" in results[1]


async def test_pages_lead_through_the_whole_file_and_then_a_write_is_allowed(tmp_path: Path) -> None:
    memory_md = tmp_path / "memory" / "MEMORY.md"
    memory_md.parent.mkdir(parents=True)
    memory_md.write_text(FACTS)
    files = FilesTool(tmp_path, max_bytes=1_000_000, long_term=LongTermMemory(memory_md), page_chars=5000)

    seen: list[str] = []
    offset = 1
    while True:
        result = await run(files, action="read", path="memory/MEMORY.md", offset=offset)
        assert len(result) < 5600
        seen.append(body_of(result))
        if "next page" not in result:
            break
        assert "write is refused" not in result
        assert "to replace the whole file read every page first" in result
        offset = int(result.rsplit("offset=", 1)[1].split(".")[0])
        if offset < 300:  # half-way: the model's view is partial, a whole write is refused
            assert "read only part" in await refused(
                files, action="write", path="memory/MEMORY.md", content="".join(seen)
            )
    assert "".join(seen) == FACTS and len(seen) > 3
    assert "Wrote" in await run(files, action="write", path="memory/MEMORY.md", content=FACTS + "- new\n")
    assert (await asyncio.to_thread(memory_md.read_text)).endswith("- new\n")


async def test_limit_and_offset_pick_lines_and_partial_plain_files_are_protected_too(tmp_path: Path) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text("".join(f"line {i}\n" for i in range(1, 11)))
    files = FilesTool(tmp_path, max_bytes=10_000)

    result = await run(files, action="read", path="notes.md", offset=4, limit=2)
    assert body_of(result) == "line 4\nline 5\n" and "lines 4-5 of 10" in result and "offset=6" in result
    assert "read only part of notes.md" in await refused(files, action="write", path="notes.md", content="x")
    assert "Appended" in await run(files, action="append", path="notes.md", content="line 11\n")
    assert "read only part" in await refused(files, action="write", path="notes.md", content="line 4\n")
    whole = await run(files, action="read", path="notes.md")
    assert "page:" not in whole and "line 11" in whole
    assert "Wrote" in await run(files, action="write", path="notes.md", content="fresh\n")
    beyond = await run(files, action="read", path="notes.md", offset=50)
    assert "the file has 1 lines" in beyond
    assert "must be 1 or more" in await refused(files, action="read", path="notes.md", offset=0)


async def test_content_with_a_cut_marker_is_never_written(tmp_path: Path) -> None:
    files = FilesTool(tmp_path, max_bytes=100_000)
    shortened = cap("x" * 30_000 + "\n", 16_000)  # what the tool loop shows of an oversized result
    assert CUT_MARKER.search(shortened)  # the marker the loop writes is the one the tool looks for
    for action in ("write", "append"):
        assert "marker of a shortened view" in await refused(
            files, action=action, path="a.md", content=shortened
        )
    assert not (tmp_path / "a.md").exists()


async def test_a_line_longer_than_a_page_is_shown_cut_and_blocks_a_whole_write(tmp_path: Path) -> None:
    (tmp_path / "wide.txt").write_text("short\n" + "w" * 3000 + "\nend\n")
    files = FilesTool(tmp_path, max_bytes=100_000, page_chars=1000)
    first = await run(files, action="read", path="wide.txt")
    assert "lines 1-1 of 3" in first and "offset=2" in first
    second = await run(files, action="read", path="wide.txt", offset=2)
    assert "line 2 is longer than a page" in second and len(second) < 1500
    await run(files, action="read", path="wide.txt", offset=3)
    assert "read only part" in await refused(files, action="write", path="wide.txt", content="short\nend\n")


async def test_the_files_tool_cannot_grow_memory_md_past_its_hard_limit(tmp_path: Path) -> None:
    memory_md = tmp_path / "memory" / "MEMORY.md"
    memory_md.parent.mkdir(parents=True)
    memory_md.write_text("- likes tea\n")
    files = FilesTool(
        tmp_path, max_bytes=10_000_000, long_term=LongTermMemory(memory_md, limits=Limits(2048))
    )
    await run(files, action="read", path="memory/MEMORY.md")
    for action in ("write", "append"):
        assert "over its limit of 2048" in await refused(
            files, action=action, path="memory/MEMORY.md", content="- " + "x" * 5_000_000
        )
    assert await asyncio.to_thread(memory_md.read_text) == "- likes tea\n"
