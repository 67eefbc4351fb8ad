"""Consolidation against the fake LLM server: happy path, parsing tiers, garbage, timeouts, races."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from structlog.testing import capture_logs

from bot.config import MemorySettings
from bot.domain import Message, Role, ToolCall
from bot.llm import LLMClient
from bot.memory import MemoryService
from bot.memory.consolidation import format_messages
from bot.memory.consolidation_reply import parse_reply
from bot.memory.history import RAW_FALLBACK
from bot.memory.items import ItemType, Layer
from bot.metrics import Metrics
from tests.bot.memory.conftest import UTC_ZONE, Clock, make_memory
from tests.fakes.llm_server import FakeLLMServer, FakeReply

# Loaded at import (ZoneInfo caches it): reading tzdata inside a test's event loop is blocking I/O.
ZoneInfo("America/Los_Angeles")


def conversation(clock: Clock, n: int = 6) -> list[Message]:
    out = []
    for i in range(n):
        role = Role.USER if i % 2 == 0 else Role.ASSISTANT
        out.append(
            Message(role, f"message {i} about the Lisbon trip", timestamp=clock.now + timedelta(minutes=i))
        )
    return out


def reply(
    entry: str = "We planned the Lisbon trip.",
    memory: str | None = "- User is going to Lisbon\n",
    **extra: Any,
) -> str:
    data: dict[str, Any] = {"history_entry": entry, "memory_update": memory, **extra}
    return json.dumps(data)


async def test_happy_path_writes_history_month_file_memory_and_archive(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    memory = await make_memory(tmp_path, clock, llm)
    items = [{"type": "preference", "content": "User prefers window seats", "confidence": 0.9}]
    fake_llm.script(FakeReply(text=reply(items=items)))
    messages = conversation(clock)

    result = await memory.consolidate("cli:me", messages, timeout=5)

    assert not result.raw_fallback and result.memory_changed and result.parse_tier == 1
    assert result.archived == len(messages)
    history = (memory.root / "HISTORY.md").read_text()
    assert "We planned the Lisbon trip." in history and "cli:me" in history
    assert (memory.root / "HISTORY-2024-05.md").read_text() == history
    assert (memory.root / "MEMORY.md").read_text() == "- User is going to Lisbon\n"
    archived = await memory.archive.read("cli:me")
    assert [m.id for m in archived] == [m.id for m in messages]
    semantic = memory.items.items(Layer.SEMANTIC)
    assert [i.content for i in semantic] == ["User prefers window seats"]
    assert semantic[0].references and semantic[0].references[0].session_id == "cli:me"
    prompt = fake_llm.requests[-1].body["messages"][-1]["content"]
    assert "[2024-05-20 09:30] USER: message 0 about the Lisbon trip" in prompt


async def test_history_is_dated_and_filed_in_the_configured_time_zone(
    tmp_path: Path, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    # 01:30 UTC on June 1st is still the evening of May 31st in California.
    clock = Clock(datetime(2024, 6, 1, 1, 30, tzinfo=UTC))
    memory = await make_memory(tmp_path, clock, llm, timezone="America/Los_Angeles")
    fake_llm.script(FakeReply(text=reply()), FakeReply(text="no JSON at all"))

    await memory.consolidate("cli:me", conversation(clock), timeout=5)
    await memory.consolidate("cli:me", conversation(clock), timeout=5)  # a raw fallback

    month = (memory.root / "HISTORY-2024-05.md").read_text()
    assert month.count("## 2024-05-31T18:30:00-07:00 — cli:me") == 2
    assert not (memory.root / "HISTORY-2024-06.md").exists()


@pytest.mark.parametrize(
    ("text", "tier"),
    [
        ('```json\n{"history_entry": "fenced", "memory_update": "m"}\n```', 1),
        ('Sure! Here it is: {"history_entry": "in prose {braces}", "memory_update": "m"} Bye.', 2),
        ('{"history_entry": "cut off", "memory_update": "m", "items": [', 3),
    ],
)
def test_each_parsing_tier(text: str, tier: int) -> None:
    parsed = parse_reply(text)
    assert parsed is not None
    assert parsed.tier == tier and parsed.memory_update == "m"
    assert parsed.history_entry in {"fenced", "in prose {braces}", "cut off"}


def test_a_string_cut_before_its_closing_quote_is_not_a_value() -> None:
    parsed = parse_reply('{"history_entry": "done", "memory_update": "- fact 1\\n- fact 2\\n- fa')
    assert parsed is not None and parsed.history_entry == "done" and parsed.memory_update is None


def test_non_string_values_are_coerced_but_marked() -> None:
    parsed = parse_reply(
        json.dumps({"history_entry": ["one.", "two."], "memory_update": {"k": 1}, "items": "x"})
    )
    assert parsed is not None
    assert parsed.history_entry == "one.\ntwo." and parsed.facts == []
    assert parsed.memory_type == "dict"


def test_format_marks_tools_and_skips_results(clock: Clock) -> None:
    call = ToolCall("c1", "web_fetch", "{}")
    text = format_messages(
        [
            Message(
                Role.ASSISTANT,
                "looking",
                tool_calls=(call, ToolCall("c2", "time", "{}")),
                timestamp=clock.now,
            ),
            Message(Role.TOOL, "page body", tool_call_id="c1", name="web_fetch", timestamp=clock.now),
        ],
        tz=UTC_ZONE,
    )
    assert text == "[2024-05-20 09:30] ASSISTANT [tools: web_fetch, time]: looking"


async def test_a_memory_md_past_what_the_bot_reads_keeps_the_history_entry_and_is_left_alone(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    """The model saw only the start of a MEMORY.md the operator let grow past the read cap: its
    memory_update was refused when written (MemoryFull), after the history entry had gone in, and the
    raw fallback wrote a second entry for the same messages."""
    memory = await make_memory(tmp_path, clock, llm)
    huge = "".join(f"- operator fact {n:07d}\n" for n in range(80_000))  # ~1.9 MB, past limit + 1 MiB
    await asyncio.to_thread((memory.root / "MEMORY.md").write_text, huge)
    fake_llm.script(FakeReply(text=reply()))

    result = await memory.consolidate("cli:me", conversation(clock), timeout=5)

    assert not result.raw_fallback and not result.memory_changed
    history = (memory.root / "HISTORY.md").read_text()
    assert history.count("cli:me") == 1 and "We planned the Lisbon trip." in history
    assert (memory.root / "MEMORY.md").read_text() == huge


async def test_a_memory_md_the_operator_made_read_only_keeps_the_history_entry_and_is_left_alone(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    """``chmod a-w MEMORY.md``: the consolidation's rewrite was swapped in over it (a new 0600 file)."""
    memory = await make_memory(tmp_path, clock, llm)
    path = memory.root / "MEMORY.md"
    path.write_text("- operator fact\n")
    os.chmod(path, 0o444)
    items = [{"type": "preference", "content": "User prefers window seats", "confidence": 0.9}]
    fake_llm.script(FakeReply(text=reply(memory="- operator fact\n- User is going to Lisbon\n", items=items)))

    with capture_logs() as logs:
        result = await memory.consolidate("cli:me", conversation(clock), timeout=5)

    assert not result.raw_fallback and not result.memory_changed
    history = (memory.root / "HISTORY.md").read_text()
    assert history.count("cli:me") == 1 and "We planned the Lisbon trip." in history
    assert path.read_text() == "- operator fact\n" and path.stat().st_mode & 0o777 == 0o444
    assert [i.content for i in memory.items.items(Layer.SEMANTIC)] == ["User prefers window seats"]
    [logged] = [e for e in logs if e["event"] == "memory_file_read_only"]
    assert f"chmod u+w {path}" in logged["hint"]


async def test_a_crlf_memory_md_the_model_returns_unchanged_is_not_a_change(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    """The model writes LF lines: a CRLF file (with a BOM) it returned as it was counted as changed, and
    when the operator had made it read-only, every consolidation logged a refused write of nothing."""
    memory = await make_memory(tmp_path, clock, llm)
    path = memory.root / "MEMORY.md"
    path.write_bytes("\ufeff- operator fact\r\n- likes tea\r\n".encode())
    os.chmod(path, 0o444)
    fake_llm.script(FakeReply(text=reply(memory="- operator fact\n- likes tea\n")))

    with capture_logs() as logs:
        result = await memory.consolidate("cli:me", conversation(clock), timeout=5)

    assert not result.raw_fallback and not result.memory_changed
    assert not [e for e in logs if e["event"] == "memory_file_read_only"]
    assert path.read_bytes() == "\ufeff- operator fact\r\n- likes tea\r\n".encode()


async def test_garbage_output_falls_back_to_raw_entry(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    memory = await make_memory(tmp_path, clock, llm)
    await memory.longterm.update(lambda _: "- operator fact\n")
    fake_llm.script(FakeReply(text="I'd rather not answer in JSON today."))

    result = await memory.consolidate("cli:me", conversation(clock, 14), timeout=5)

    assert result.raw_fallback
    history = (memory.root / "HISTORY.md").read_text()
    assert RAW_FALLBACK in history
    assert history.count("- USER: ") + history.count("- ASSISTANT: ") == 10  # the last 10 messages
    assert "message 13" in history and "message 3 " not in history
    assert (memory.root / "MEMORY.md").read_text() == "- operator fact\n"


@pytest.mark.parametrize(
    "declined",
    [
        FakeReply(text=reply(), stop="content_filter"),  # the filter stopped it after the JSON
        FakeReply(  # ... or in the middle of memory_update: the history entry was whole
            text='{"history_entry": "We planned the Lisbon trip.", "memory_update": "- User is go',
            stop="content_filter",
        ),
        FakeReply(refusal="I'm sorry, but I can't help with that."),  # OpenAI's refusal, no content
    ],
    ids=["filtered-after-the-json", "filtered-midway", "refusal-field"],
)
async def test_an_answer_the_model_declined_is_a_failed_consolidation(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer, declined: FakeReply
) -> None:
    """An answer the model (or its provider's filter) declined to give is no consolidation, whatever
    JSON came before it stopped: its history entry was written to HISTORY.md and its memory_update
    replaced MEMORY.md. It goes the way of a failed call: a raw-fallback entry that says why."""
    memory = await make_memory(tmp_path, clock, llm)
    await memory.longterm.update(lambda _: "- operator fact\n")
    fake_llm.script(declined)

    result = await memory.consolidate("cli:me", conversation(clock), timeout=5)

    assert result.raw_fallback and "declined" in result.reason
    history = (memory.root / "HISTORY.md").read_text()
    assert RAW_FALLBACK in history and "declined" in history
    assert "We planned" not in history and "can't help" not in history
    assert (memory.root / "MEMORY.md").read_text() == "- operator fact\n"


@pytest.mark.parametrize(
    "blank",
    [reply("", ""), reply("  ", "- operator fact\n"), reply("", "- operator fact")],
    ids=["both-blank", "no-entry-memory-unchanged", "no-entry-memory-unchanged-but-newline"],
)
async def test_a_blank_answer_is_a_failed_consolidation(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer, blank: str
) -> None:
    """JSON with no history entry and MEMORY.md as it was says nothing: the consolidation counted as
    done, and the retiring messages left the session with no trace in HISTORY.md."""
    memory = await make_memory(tmp_path, clock, llm)
    await memory.longterm.update(lambda _: "- operator fact\n")
    fake_llm.script(FakeReply(text=blank))

    result = await memory.consolidate("cli:me", conversation(clock), timeout=5)

    assert result.raw_fallback and "blank" in result.reason
    history = (memory.root / "HISTORY.md").read_text()
    assert RAW_FALLBACK in history and "message 5 about the Lisbon trip" in history
    assert (memory.root / "MEMORY.md").read_text() == "- operator fact\n"


@pytest.mark.parametrize(
    "fields",
    [{"history_entry": "", "memory_update": "- operator fact\n"}, {}],
    ids=["no-entry-memory-unchanged", "only-items"],
)
async def test_the_facts_of_an_answer_without_a_summary_are_stored_beside_the_verbatim_messages(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer, fields: dict[str, Any]
) -> None:
    """An answer that lists facts but writes no history entry and leaves MEMORY.md as it was is whole,
    only without a summary: HISTORY.md keeps the messages verbatim, and the facts are stored as items.
    They were dropped with the rest (an answer with only ``items`` was even "no usable JSON")."""
    memory = await make_memory(tmp_path, clock, llm)
    await memory.longterm.update(lambda _: "- operator fact\n")
    items = [{"type": "preference", "content": "User prefers window seats", "confidence": 0.9}]
    fake_llm.script(FakeReply(text=json.dumps({**fields, "items": items})))

    result = await memory.consolidate("cli:me", conversation(clock), timeout=5)

    assert result.raw_fallback and "blank" in result.reason
    history = (memory.root / "HISTORY.md").read_text()
    assert RAW_FALLBACK in history and "message 5 about the Lisbon trip" in history
    assert (memory.root / "MEMORY.md").read_text() == "- operator fact\n"
    stored = memory.items.items(Layer.SEMANTIC)
    assert [i.content for i in stored] == ["User prefers window seats"]
    assert stored[0].references[0].session_id == "cli:me"


async def test_timeout_falls_back_and_archives(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    memory = await make_memory(tmp_path, clock, llm)
    fake_llm.script(FakeReply(text=reply(), delay=30))

    result = await memory.consolidate("cli:me", conversation(clock), timeout=0.3)

    assert result.raw_fallback and "timed out" in result.reason
    assert RAW_FALLBACK in (memory.root / "HISTORY.md").read_text()
    assert len(await memory.archive.read("cli:me")) == 6


async def test_llm_error_falls_back(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    memory = await make_memory(tmp_path, clock, llm)
    fake_llm.script(
        FakeReply(status=400, error={"error": {"message": "bad request from key sk-live-echoed"}})
    )
    result = await memory.consolidate("cli:me", conversation(clock), timeout=5)
    assert result.raw_fallback and "LLM" in result.reason
    # The reason is kept in HISTORY.md, which the model's tools read: the server's words (and address,
    # which may carry a password) stay in the log.
    history = (memory.root / "HISTORY.md").read_text()
    assert "sk-live-echoed" not in history and "127.0.0.1" not in history and "HTTP 400" not in history


async def test_two_sessions_at_once_keep_memory_consistent(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    memory = await make_memory(tmp_path, clock, llm)
    seen_memory: list[str] = []

    def respond(api: str, body: dict[str, Any]) -> FakeReply:
        prompt = body["messages"][-1]["content"]
        current = prompt.split("## Current MEMORY.md\n", 1)[1].split("\n\n## Conversation", 1)[0]
        seen_memory.append(current)
        base = "" if current == "(empty)" else current + "\n"
        session = "A" if "alpha" in prompt else "B"
        return FakeReply(text=reply(f"session {session}", base + f"- fact from {session}"), delay=0.05)

    fake_llm.responder = respond
    a = [Message(Role.USER, "alpha things", timestamp=clock.now)]
    b = [Message(Role.USER, "beta things", timestamp=clock.now)]

    results = await asyncio.gather(
        memory.consolidate("cli:a", a, timeout=5), memory.consolidate("cli:b", b, timeout=5)
    )

    assert not any(r.raw_fallback for r in results)
    text = (memory.root / "MEMORY.md").read_text()
    assert "- fact from A" in text and "- fact from B" in text  # the second saw the first's result
    assert seen_memory[0] == "(empty)" and seen_memory[1] != "(empty)"


async def test_operator_edit_during_consolidation_survives(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    memory = await make_memory(tmp_path, clock, llm)
    path = memory.root / "MEMORY.md"
    await memory.longterm.update(lambda _: "- old fact\n- stale fact\n")

    def respond(api: str, body: dict[str, Any]) -> FakeReply:
        # The operator saves the file while the model is thinking.
        path.write_text("- old fact\n- stale fact\n- operator: the wifi password is tulip\n")
        return FakeReply(text=reply("entry", "- old fact\n- bot: user moved to Porto\n"))

    fake_llm.responder = respond
    result = await memory.consolidate("cli:me", conversation(clock), timeout=5)

    assert result.memory_changed and result.memory_merged
    lines = path.read_text().splitlines()
    assert "- operator: the wifi password is tulip" in lines  # the operator's text survives
    assert "- bot: user moved to Porto" in lines  # the bot's addition is merged in
    assert "- stale fact" not in lines  # and its pruning applied


async def test_oversized_memory_asks_for_compression(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    memory = await make_memory(tmp_path, clock, llm, max_memory_size=100)
    await memory.longterm.update(lambda _: "- fact\n" * 40)
    fake_llm.script(FakeReply(text=reply()))
    await memory.consolidate("cli:me", conversation(clock), timeout=5)
    assert "compress it" in fake_llm.requests[-1].body["messages"][-1]["content"]


async def test_background_consolidation_is_awaited_by_close(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    memory = await make_memory(tmp_path, clock, llm)
    fake_llm.script(FakeReply(text=reply(), delay=0.1))
    task = await memory.consolidate_in_background("cli:me", conversation(clock))
    assert task is not None and memory.pending_consolidations == 1
    await memory.close()
    assert task.done() and not task.result().raw_fallback
    assert memory.pending_consolidations == 0


async def test_without_model_consolidation_writes_raw_fallback(tmp_path: Path, clock: Clock) -> None:
    memory = await make_memory(tmp_path, clock)
    result = await memory.consolidate("cli:me", conversation(clock), timeout=1)
    assert result.raw_fallback and RAW_FALLBACK in (memory.root / "HISTORY.md").read_text()


def test_durable_item_types_are_filtered() -> None:
    parsed = parse_reply(
        json.dumps(
            {
                "history_entry": "e",
                "items": [
                    {"type": "Task State", "content": "finish report", "confidence": "high"},
                    {"type": "episode", "content": "not durable"},
                    {"type": "fact", "content": "  "},
                    {"type": "fact", "content": "x" * 5000},  # not a fact: a page
                ],
            }
        )
    )
    assert parsed is not None
    assert [(f.type, f.content, f.confidence) for f in parsed.facts] == [
        (ItemType.TASK_STATE, "finish report", 0.8)
    ]


async def test_every_consolidation_is_counted_as_ok_or_fallback(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    metrics = Metrics()
    memory = MemoryService(tmp_path / "memory", MemorySettings(), llm=llm, clock=clock, observer=metrics)
    await memory.start()
    fake_llm.script(FakeReply(text=reply()))
    assert not (await memory.consolidate("cli:me", conversation(clock), timeout=5)).raw_fallback
    fake_llm.script(FakeReply(text="not JSON at all"))
    assert (await memory.consolidate("cli:me", conversation(clock), timeout=5)).raw_fallback
    await memory.close()

    counted = metrics.registry.get_sample_value
    assert counted("membot_consolidations_total", {"result": "ok"}) == 1
    assert counted("membot_consolidations_total", {"result": "fallback"}) == 1
