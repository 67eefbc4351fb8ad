"""A consolidation answer replaces MEMORY.md only when it can be trusted to hold all of it.

Seen by a tester: an answer cut at the output limit (``finish_reason: length``) still produced a
``memory_update`` through the third parsing tier, and MEMORY.md went from 160 facts to 106 (once from
5 MB to 8 bytes) with nothing in the log; a list or a number in ``memory_update`` replaced the file; a
5 MB update was written. Each case here goes through the real LLM client and the fake server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from bot.config import LLMSettings, MemorySettings
from bot.domain import Message, Role
from bot.llm import LLMClient
from bot.memory import MemoryService
from bot.memory.history import RAW_FALLBACK
from bot.memory.pack import estimate_tokens
from tests.bot.memory.conftest import CATALOG, Clock, make_memory
from tests.fakes.llm_server import FakeLLMServer, FakeReply

FACTS = "".join(f"- fact {i:03d}: something the user said that is worth keeping\n" for i in range(160))
MODELS = {"openai": "gpt-4.1-mini", "anthropic": "claude-haiku-4-5"}


@pytest.fixture(params=["openai", "anthropic"])
async def client(request: pytest.FixtureRequest, fake_llm: FakeLLMServer) -> AsyncIterator[LLMClient]:
    settings = LLMSettings.model_validate(
        {
            "model": MODELS[request.param],
            "openai": {"base_url": fake_llm.openai_base_url, "api_key": "sk-test"},
            "anthropic": {"base_url": fake_llm.anthropic_base_url, "api_key": "sk-ant-test"},
            "timeout": 10.0,
            "max_retries": 0,
        }
    )
    async with httpx.AsyncClient() as http:
        yield LLMClient(settings, CATALOG, http)


def conversation(clock: Clock) -> list[Message]:
    return [
        Message(Role.USER, f"message {i} about the Lisbon trip", timestamp=clock.now + timedelta(minutes=i))
        for i in range(4)
    ]


async def consolidate_with(
    tmp_path: Path,
    clock: Clock,
    llm: LLMClient,
    reply: FakeReply,
    fake: FakeLLMServer,
    *,
    facts: str = FACTS,
    **settings: Any,
) -> tuple[Any, str, list[dict[str, Any]], Any]:
    memory = await make_memory(tmp_path, clock, llm, **settings)
    await memory.longterm.update(lambda _: facts)
    fake.script(reply)
    with capture_logs() as logs:
        result = await memory.consolidate("cli:me", conversation(clock), timeout=5)
    text = await asyncio.to_thread((memory.root / "MEMORY.md").read_text)
    return result, text, logs, memory


async def test_an_answer_cut_at_the_output_limit_never_replaces_memory_md(
    tmp_path: Path, clock: Clock, client: LLMClient, fake_llm: FakeLLMServer
) -> None:
    kept = "".join(FACTS.splitlines(keepends=True)[:106])
    cut = json.dumps({"history_entry": "We planned the trip.", "memory_update": kept + "- fact 106: som"})
    reply = FakeReply(text=cut[:-2], cut_off=True)  # the closing quote and brace never came

    result, text, logs, memory = await consolidate_with(tmp_path, clock, client, reply, fake_llm)

    assert text == FACTS  # all 160 facts
    assert result.raw_fallback and "cut at the output limit" in result.reason
    assert not result.memory_changed and result.facts == []
    history = await asyncio.to_thread((memory.root / "HISTORY.md").read_text)
    assert RAW_FALLBACK in history and "We planned the trip." not in history  # used whole or not at all
    warning = next(e for e in logs if e["event"] == "consolidation_fallback")
    assert warning["log_level"] == "warning" and "cut at the output limit" in warning["reason"]


async def test_a_complete_looking_answer_flagged_as_cut_is_not_trusted_either(
    tmp_path: Path, clock: Clock, client: LLMClient, fake_llm: FakeLLMServer
) -> None:
    kept = "".join(FACTS.splitlines(keepends=True)[:10])
    reply = FakeReply(text=json.dumps({"history_entry": "x", "memory_update": kept}), cut_off=True)
    result, text, _, _ = await consolidate_with(tmp_path, clock, client, reply, fake_llm)
    assert text == FACTS and result.raw_fallback


@pytest.mark.parametrize("update", [["- a", "- b"], 42, {"facts": ["- a"]}, True])
async def test_memory_update_must_be_a_string(
    tmp_path: Path, clock: Clock, client: LLMClient, fake_llm: FakeLLMServer, update: object
) -> None:
    reply = FakeReply(text=json.dumps({"history_entry": "x", "memory_update": update}))
    result, text, logs, _ = await consolidate_with(tmp_path, clock, client, reply, fake_llm)
    assert text == FACTS
    assert result.raw_fallback and f"a JSON {type(update).__name__}" in result.reason
    assert any(e["event"] == "consolidation_fallback" for e in logs)


async def test_a_partial_parse_never_replaces_memory_md(
    tmp_path: Path, clock: Clock, client: LLMClient, fake_llm: FakeLLMServer
) -> None:
    broken = '{"history_entry": "x", "memory_update": "- only this\\n", "items": [{"type": '
    result, text, _, _ = await consolidate_with(tmp_path, clock, client, FakeReply(text=broken), fake_llm)
    assert text == FACTS and result.raw_fallback and "not valid JSON" in result.reason


async def test_an_update_dropping_most_lines_needs_a_reason(
    tmp_path: Path, clock: Clock, client: LLMClient, fake_llm: FakeLLMServer
) -> None:
    few = "".join(FACTS.splitlines(keepends=True)[:50]) + "- new fact\n"
    silent = FakeReply(text=json.dumps({"history_entry": "x", "memory_update": few}))
    result, text, _, _ = await consolidate_with(tmp_path, clock, client, silent, fake_llm)
    assert text == FACTS and result.raw_fallback and "keeps 50 of 160 lines" in result.reason

    said = FakeReply(
        text=json.dumps(
            {
                "history_entry": "x",
                "memory_update": few,
                "memory_pruned": "110 facts were about a cancelled trip",
            }
        )
    )
    result, text, _, memory = await consolidate_with(tmp_path / "2", clock, client, said, fake_llm)
    assert not result.raw_fallback and text == few
    removed = await asyncio.to_thread(memory.longterm.replaced_path.read_text)
    assert "- fact 159:" in removed  # and what it dropped can be put back


@pytest.mark.parametrize(
    ("facts", "update", "pruned"),
    [
        (FACTS, "- lives in Lisbon\n", "none"),  # "none" is no reason to drop 160 lines
        (FACTS, "- lives in Lisbon\n", "N/A"),
        ("".join(f"- operator fact {i}\n" for i in range(5)), "No changes.", ""),  # a short file: all gone
    ],
)
async def test_an_update_dropping_the_file_for_no_reason_is_refused(
    tmp_path: Path,
    clock: Clock,
    client: LLMClient,
    fake_llm: FakeLLMServer,
    facts: str,
    update: str,
    pruned: str,
) -> None:
    reply = FakeReply(
        text=json.dumps({"history_entry": "x", "memory_update": update, "memory_pruned": pruned})
    )
    result, text, _, _ = await consolidate_with(tmp_path, clock, client, reply, fake_llm, facts=facts)
    assert text == facts and result.raw_fallback and "gives no reason" in result.reason


async def test_an_oversized_update_is_refused(
    tmp_path: Path, clock: Clock, client: LLMClient, fake_llm: FakeLLMServer
) -> None:
    huge = FACTS + "- " + "x" * 5_000_000 + "\n"
    reply = FakeReply(text=json.dumps({"history_entry": "x", "memory_update": huge}))
    result, text, _, _ = await consolidate_with(tmp_path, clock, client, reply, fake_llm)
    assert text == FACTS and result.raw_fallback and "over the limit of 65536" in result.reason


async def test_a_sound_update_is_still_written(
    tmp_path: Path, clock: Clock, client: LLMClient, fake_llm: FakeLLMServer
) -> None:
    reply = FakeReply(text=json.dumps({"history_entry": "x", "memory_update": FACTS + "- lives in Lisbon\n"}))
    result, text, _, _ = await consolidate_with(tmp_path, clock, client, reply, fake_llm)
    assert not result.raw_fallback and result.memory_changed and text == FACTS + "- lives in Lisbon\n"


async def test_the_request_fits_the_window_or_is_not_sent(
    tmp_path: Path, clock: Clock, client: LLMClient, fake_llm: FakeLLMServer
) -> None:
    """With a 30 KB MEMORY.md on an 8k model the request was 8,822 tokens + 2,048 to answer: refused
    every time by a real server, so MEMORY.md could never be compressed."""
    room = 1500  # tokens of prompt the model's window takes beside the answer
    memory = MemoryService(
        tmp_path / "memory",
        MemorySettings(),
        timezone="UTC",
        llm=client,
        clock=clock,
        consolidation_room=room,
    )
    await memory.start()
    await memory.longterm.update(lambda _: "".join(f"- fact {i}\n" for i in range(20)))
    long_talk = [
        Message(Role.USER, f"message {i}: " + "word " * 150, timestamp=clock.now + timedelta(minutes=i))
        for i in range(30)
    ]
    fake_llm.script(FakeReply(text=json.dumps({"history_entry": "talked", "memory_update": None})))
    result = await memory.consolidate("cli:me", long_talk, timeout=5)
    (sent,) = fake_llm.requests
    content = sent.body["messages"][-1]["content"]  # Anthropic's wire: a list of parts
    prompt = content if isinstance(content, str) else "".join(part["text"] for part in content)
    assert not result.raw_fallback and "message 29:" in prompt and "message 0:" not in prompt  # newest kept
    assert estimate_tokens(prompt) <= room

    await memory.longterm.update(
        lambda _: "".join(f"- operator fact {i} " + "word " * 20 + "\n" for i in range(300))
    )
    later = [Message(Role.USER, f"later {i}", timestamp=clock.now + timedelta(hours=1)) for i in range(2)]
    result = await memory.consolidate("cli:me", later, timeout=5)  # (messages retired once)
    assert result.raw_fallback and "leaves no room in the model's window" in result.reason
    assert len(fake_llm.requests) == 1  # never sent
    await memory.close()
