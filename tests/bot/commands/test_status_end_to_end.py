"""/status checked against what really happened: the bot of ``bot.app.build_core``, its dispatcher and
a fake model server whose requests and reported usage are the truth each figure is checked against."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.app import build_core
from bot.config import load_settings
from bot.tokens import TokenCounter
from tests.chat_kit import Chat
from tests.fakes.llm_server import FakeLLMServer, FakeReply

MODEL = "gpt-4.1-mini"


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter.offline(model=MODEL, provider="openai")


@contextlib.asynccontextmanager
async def chat(workspace: Path, llm: FakeLLMServer, **llm_settings: Any) -> AsyncIterator[Chat]:
    overrides: dict[str, Any] = {
        "workspace": workspace,
        "llm": {
            "model": MODEL,
            "openai": {"base_url": llm.openai_base_url, "api_key": "sk-test-key-123456"},
            **llm_settings,
        },
    }
    settings = await asyncio.to_thread(load_settings, None, env_file=None, overrides=overrides)
    async with build_core(settings) as core:
        yield Chat(core)


def figure(status: str, label: str) -> str:
    """The line of ``status`` that starts with ``label`` ("" if there is none)."""
    return next((line for line in status.splitlines() if line.startswith(label)), "")


def tokens_of(text: str) -> float:
    """ "≈7.1k" -> 7100."""
    value = re.sub(r"[≈,]", "", text)
    return float(value[:-1]) * 1000 if value.endswith("k") else float(value)


async def test_context_use_follows_the_prompt_size_the_provider_reports(
    tmp_path: Path, counter: TokenCounter
) -> None:
    """The calibration left the tool schemas out of its estimate while the provider counts them: with a
    provider that counts exactly as we do, /status showed 15% more than the next request holds."""

    def counted(body: dict[str, Any]) -> int:  # the provider's count: schemas and messages, as sent
        total = counter.count_text(json.dumps(body.get("tools", [])))
        for m in body["messages"]:
            content = m.get("content")
            total += 4 + counter.count_text(content if isinstance(content, str) else json.dumps(content))
        return total

    async with FakeLLMServer() as llm:
        reply = "noted " * 40
        llm.responder = lambda api, body: FakeReply(text=reply, usage=(counted(body), 40))
        async with chat(tmp_path / "ws", llm) as bot:
            for i in range(3):
                await bot.say(f"topic {i}: " + "word " * 1500)
            status = await bot.say("/status")

    assert llm.requests[-1].body.get("tools"), "the default tools are sent"
    shown = tokens_of(figure(status, "Context:").split()[1])
    next_request = counted(llm.requests[-1].body) + 4 + counter.count_text(reply)
    assert shown == pytest.approx(next_request, rel=0.03), status


async def test_status_names_the_fallback_model_that_answered(tmp_path: Path) -> None:
    """After a failover /status named only the configured model, not the one whose answer the chat got;
    once the main model answers again, the line is gone."""
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(status=500), FakeReply(text="from the fallback"))
        async with chat(tmp_path / "ws", llm, fallback_models=["gpt-4o-mini"], max_retries=0) as bot:
            assert await bot.say("hello") == "from the fallback"
            after_failover = await bot.say("/status")
            assert await bot.say("again") == "echo: again"
            after_recovery = await bot.say("/status")

    assert [r.body["model"] for r in llm.requests] == [MODEL, "gpt-4o-mini", MODEL]
    assert figure(after_failover, "Model:") == f"Model: GPT-4.1 mini ({MODEL}, balanced tier)"
    assert figure(after_failover, "Last answer:") == (
        f"Last answer: from the fallback model gpt-4o-mini ({MODEL} was not answering)"
    )
    assert "Last answer:" not in after_recovery


async def test_status_says_meaning_search_waits_while_the_embedding_model_fails(tmp_path: Path) -> None:
    """With the embeddings endpoint out of reach, memory is found by words alone: /status said nothing
    of it (the operator's log did), so a chat user could not tell why recall got worse."""
    async with FakeLLMServer() as llm:
        overrides: dict[str, Any] = {
            "workspace": tmp_path / "ws",
            "llm": {
                "model": MODEL,
                "openai": {"base_url": llm.openai_base_url, "api_key": "sk-test-key-123456"},
            },
            "memory": {"embeddings": "openai", "embeddings_base_url": "http://127.0.0.1:9/v1"},  # refused
        }
        settings = await asyncio.to_thread(load_settings, None, env_file=None, overrides=overrides)
        async with build_core(settings) as core:
            bot = Chat(core)
            await bot.say("I moved to Lisbon in March and I love the trams.")
            vectors = core.memory.vectors if core.memory is not None else None
            assert vectors is not None
            assert await vectors.drain() > 0  # (returns at the first failed batch)
            failing = await bot.say("/status")

    line = figure(failing, "Meaning search:")
    assert line.startswith("Meaning search: paused, the embedding model is not answering"), failing
    assert "found by its words" in line


async def test_recall_counts_the_turns_brought_around_the_matches_apart(tmp_path: Path) -> None:
    """The best matches bring the turns around them (the answers to them), which were never candidates:
    /status said "5 memories of 3", more chosen than there were to choose from."""
    async with FakeLLMServer() as llm:
        llm.responder = lambda api, body: FakeReply(text="Noted.")  # answers no search would match
        async with chat(tmp_path / "ws", llm, max_retries=0) as bot:
            for said in (
                "I play the cello in an orchestra",
                "My cello teacher is called Ana",
                "The orchestra rehearses on Sunday",
            ):
                await bot.say(said)
            await bot.say("/new")  # a fresh conversation: the turns now come from memory
            await bot.say("tell me about my cello and the orchestra")
            status = await bot.say("/status")

    line = figure(status, "Last recall:")
    shown = re.match(
        r"Last recall: (\d+) memories from (\d+) match(es)?(, with the turns around them)? \(", line
    )
    assert shown is not None, line
    memories, matches, around = int(shown[1]), int(shown[2]), shown[4]
    assert memories > matches and around, line  # 3 messages matched, their answers came along
    assert "of its answers" in line
