"""Long chats through the real bot (``bot.app.build_core``: dispatcher, pipeline, memory) with a model
of a small window, a local one whose tokens membot can only estimate; the fake model server's requests
are the record of what reached the model."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.app import build_core
from bot.compaction import SUMMARY_SYSTEM
from bot.config import load_settings
from bot.tokens import TokenCounter
from tests.chat_kit import Chat
from tests.fakes.llm_server import FakeLLMServer, FakeReply

MODEL = "tiny-local"  # a name tiktoken does not know: its count is a calibrated estimate
WINDOW = 6000
OVERFLOW = {
    "error": {
        "message": f"This model's maximum context length is {WINDOW} tokens.",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
}


@contextlib.asynccontextmanager
async def small_window_chat(workspace: Path, llm: FakeLLMServer) -> AsyncIterator[Chat]:
    models = workspace.parent / "models.json"
    entry = {"id": MODEL, "provider": "openai", "max_input_tokens": WINDOW, "max_output_tokens": 512}
    await asyncio.to_thread(models.write_text, json.dumps({"version": 1, "models": [entry]}))
    overrides: dict[str, Any] = {
        "workspace": workspace,
        "models_file": models,
        "llm": {
            "model": MODEL,
            "openai": {"base_url": llm.openai_base_url, "api_key": "sk-test-key-123456"},
            "max_retries": 0,
        },
        "memory": {"embeddings": "none"},
    }
    settings = await asyncio.to_thread(load_settings, None, env_file=None, overrides=overrides)
    async with build_core(settings) as core:
        yield Chat(core)


def summary_requests(llm: FakeLLMServer) -> int:
    return sum(r.body["messages"][0].get("content") == SUMMARY_SYSTEM for r in llm.requests)


async def test_the_tool_loops_own_window_check_does_not_raise_the_token_estimate(
    tmp_path: Path, server: FakeLLMServer
) -> None:
    """The tool loop's own check before each call (the request over the window by our estimate) was
    taken for the provider's "too long": it raised the token estimate from itself, so the next check
    failed again, and one turn with no refusal at all compacted three times down to its last message.
    The estimate, raised for nothing, then left the provider's one real refusal nothing to compact, and
    that turn went unanswered; every later turn compacted (a summary and a consolidation call each)."""
    async with small_window_chat(tmp_path / "ws", server) as bot:
        for i in range(16):
            await bot.say(f"Message {i}: " + "I spent the morning in the garden and then cooked pasta. " * 8)
        refused: list[int] = []

        def refuse_once(api: str, body: dict[str, Any]) -> FakeReply | None:
            if "Maria" in json.dumps(body["messages"][-1]) and not refused:
                refused.append(1)
                return FakeReply(status=400, error=OVERFLOW)
            return None

        server.responder = refuse_once
        assert (await bot.say("My sister is called Maria.")).startswith("echo: My sister is called Maria.")
        assert refused
        before = summary_requests(server)
        for i in range(8):
            assert await bot.say(f"Later {i}: a short note.") == f"echo: Later {i}: a short note."

    later = summary_requests(server) - before
    assert later <= 1, f"{later} compactions in 8 short turns after one refusal"
    last_system = server.requests[-1].body["messages"][0]["content"]
    assert "left out here" not in last_system


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    """Made outside the event loop: loading an encoding reads files (blocking)."""
    return TokenCounter.offline(model="gpt-4.1-mini", provider="openai")


async def test_a_model_that_counts_more_tokens_than_the_estimate_does_not_compact_every_turn(
    tmp_path: Path, server: FakeLLMServer, counter: TokenCounter
) -> None:
    """The memory section and the compaction's recent messages were planned in the basis encoding's
    tokens, the threshold in the model's: with a model counting 30 % more (Anthropic's, a local one),
    they no longer fitted under the threshold side by side, and a small window compacted nearly every
    turn (a summary and a consolidation call each): 120 times in 150 turns, against 13 at an even
    count. Every request still fits the window."""

    def counted(body: dict[str, Any]) -> int:
        total = counter.count_text(json.dumps(body["tools"])) if body.get("tools") else 0
        for message in body["messages"]:
            content = message.get("content")
            total += 4 + counter.count_text(content if isinstance(content, str) else json.dumps(content))
        return total

    sizes: list[int] = []

    def thirty_percent_more(api: str, body: dict[str, Any]) -> FakeReply:
        size = int(counted(body) * 1.3)
        sizes.append(size + int(body.get("max_tokens") or body.get("max_completion_tokens") or 0))
        return FakeReply(text="noted", usage=(size, 20))

    server.responder = thirty_percent_more
    async with small_window_chat(tmp_path / "ws", server) as bot:
        for i in range(60):
            await bot.say(f"Message {i}: " + "today I worked in the garden, then cooked pasta. " * 4)

    compactions = summary_requests(server)
    assert compactions <= 12, f"{compactions} compactions in 60 turns"
    assert max(sizes) <= WINDOW


async def test_a_refusal_in_a_chat_too_short_to_compact_is_answered_from_a_trimmed_request(
    tmp_path: Path, server: FakeLLMServer
) -> None:
    """The provider refused a request our estimate said fits, in a chat with nothing to compact yet: the
    estimate was raised, but no compaction made room, so the turn went unanswered ("couldn't answer")
    although the raised estimate trims the request to fit."""
    refused: list[int] = []

    def refuse_the_first(api: str, body: dict[str, Any]) -> FakeReply | None:
        if not refused:
            refused.append(len(json.dumps(body)))
            return FakeReply(status=400, error=OVERFLOW)
        return None

    server.responder = refuse_the_first
    async with small_window_chat(tmp_path / "ws", server) as bot:
        long_question = (
            "Please read this and tell me what you think. " + "The garden was full of roses. " * 500
        )
        answer = await bot.say(long_question)

    assert refused and answer.startswith("echo: Please read this")
    assert len(json.dumps(server.requests[-1].body)) < refused[0]  # the retry was trimmed
