"""Facts that change over time, as they reach the model: the real bot (``bot.app.build_core``), messages
sent on given days, and the fake model server's requests as the record of what the model was shown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bot.app import build_core
from bot.config import load_settings
from bot.domain import utcnow
from bot.memory.consolidation import SYSTEM as CONSOLIDATION
from tests import chat_kit
from tests.fakes.llm_server import FakeLLMServer, FakeReply

MODEL = "gpt-4.1-mini"
DAY = datetime(2025, 3, 1, 10, 0, tzinfo=UTC)


class Chat(chat_kit.Chat):
    """The chat, each message sent on a given day."""

    async def say_on(self, text: str, day: int, *, minute: int = 0) -> str:
        """Send ``text`` on day ``day`` after :data:`DAY` and return the reply to it."""
        return await self.say(text, at=DAY + timedelta(days=day, minutes=minute))


@contextlib.asynccontextmanager
async def chat(
    workspace: Path, llm: FakeLLMServer, clock: Callable[[], datetime] = utcnow
) -> AsyncIterator[Chat]:
    """The bot, its dispatcher reading the machine's time from ``clock``."""
    values: dict[str, Any] = {
        "workspace": workspace,
        "llm": {"model": MODEL, "openai": {"base_url": llm.openai_base_url, "api_key": "sk-test-key-123456"}},
        "memory": {"embeddings": "none"},
    }
    settings = await asyncio.to_thread(load_settings, None, env_file=None, overrides=values)
    async with build_core(settings, clock=clock) as core:
        yield Chat(core)


def memory_section(llm: FakeLLMServer) -> str:
    """The ``# Memory`` part of the last request's system prompt."""
    system = llm.requests[-1].body["messages"][0]["content"]
    assert isinstance(system, str)
    return system.partition("# Memory")[2]


def last_tool_result(llm: FakeLLMServer) -> str:
    results = [m["content"] for m in llm.requests[-1].body["messages"] if m.get("role") == "tool"]
    return str(results[-1])


async def found_id(bot: Chat, llm: FakeLLMServer, query: str, day: int) -> str:
    """The id of the memory the model's ``search`` for ``query`` lists first."""
    llm.script(FakeReply(tool_calls=[("memory", {"action": "search", "query": query})]), FakeReply(text="ok"))
    await bot.say_on("What do you remember about that?", day)
    found = re.findall(r"^([0-9a-f]{16}) ", last_tool_result(llm), re.M)
    assert found, last_tool_result(llm)
    return found[0]


async def test_a_memory_the_model_forgets_by_id_no_longer_reaches_it(
    tmp_path: Path, server: FakeLLMServer
) -> None:
    """The memory tool's ``forget`` by id deleted that one item, but a message is stored as several
    (its passages, its typed sentences), and recall shows the message: after "forget" the user's
    "I live in Berlin." reached the model as before, in every later turn."""
    async with chat(tmp_path / "ws", server) as bot:
        server.script(FakeReply(text="Noted."))
        await bot.say_on("I live in Berlin.", 0)
        await bot.say_on("/new", 0, minute=1)
        item_id = await found_id(bot, server, "Berlin", 1)
        server.script(
            FakeReply(tool_calls=[("memory", {"action": "forget", "id": item_id})]), FakeReply(text="ok")
        )
        await bot.say_on("Please forget where I live.", 1, minute=2)
        assert last_tool_result(server).startswith(f"Forgot {item_id}")
        await bot.say_on("/new", 1, minute=3)
        await bot.say_on("Where do I live?", 2)

    assert "Berlin" not in memory_section(server)


async def test_a_memory_the_model_updates_reaches_it_as_the_current_fact_dated_when_it_changed(
    tmp_path: Path, server: FakeLLMServer
) -> None:
    """The memory tool's ``update`` changed an item of the message "I live in Berlin.", but recall shows
    the message as it was said: "The user lives in Lisbon." never reached the model, which kept being
    shown Berlin as the current fact. An updated fact also kept the date it was first stored, so even a
    fact of the tool's own read as old as what it replaced."""
    async with chat(tmp_path / "ws", server) as bot:
        server.script(FakeReply(text="Noted."))
        await bot.say_on("I live in Berlin.", 0)
        await bot.say_on("/new", 0, minute=1)
        item_id = await found_id(bot, server, "Berlin", 1)
        update = {"action": "update", "id": item_id, "content": "The user lives in Lisbon."}
        server.script(FakeReply(tool_calls=[("memory", update)]), FakeReply(text="ok"))
        await bot.say_on("I moved to Lisbon, please correct that.", 1, minute=2)
        await bot.say_on("/new", 1, minute=3)
        await bot.say_on("Where do I live?", 2)
        where = memory_section(server)
        server.script(FakeReply(tool_calls=[("memory", {"action": "search", "query": "lives Lisbon"})]))
        await bot.say_on("What do you remember about that?", 3)

    fact = re.search(r"^- \[\w+, (\d{4}-\d\d-\d\d)\] The user lives in Lisbon\.$", where, re.M)
    assert fact, where
    assert fact[1] > "2025-03-01"  # dated when it changed (the tool's clock), not when Berlin was said
    listed = re.search(
        rf"^{item_id} \[[\w/]+, (\d{{4}}-\d\d-\d\d)\] The user lives in Lisbon\.$",
        last_tool_result(server),
        re.M,
    )
    assert listed and listed[1] == fact[1], last_tool_result(server)


def consolidation_finds(
    fact: dict[str, Any], about: str
) -> Callable[[str, dict[str, Any]], FakeReply | None]:
    """A model that answers the consolidation of the messages saying ``about`` with ``fact``."""

    def consolidate(api: str, body: dict[str, Any]) -> FakeReply | None:
        if body["messages"][0].get("content") != CONSOLIDATION or about not in json.dumps(body):
            return None
        answer = {"history_entry": "The user said they are vegetarian.", "memory_update": "", "items": [fact]}
        return FakeReply(text=json.dumps(answer))

    return consolidate


async def test_a_confident_fact_consolidation_found_reaches_the_model_as_itself(
    tmp_path: Path, server: FakeLLMServer
) -> None:
    """A fact a consolidation found is promoted when it is confident, and the promoted copy was taken for
    a part of the first user message of the consolidated batch (its first reference): recall showed
    that message ("Hi there.") in its place, and the fact never reached the model."""
    server.responder = consolidation_finds(
        {"type": "preference", "content": "The user is vegetarian.", "confidence": 0.9}, "meat"
    )
    said = datetime.now(UTC) - timedelta(days=2)
    async with chat(tmp_path / "ws", server) as bot:
        server.script(FakeReply(text="Hello!"), FakeReply(text="Noted."))
        await bot.say("Hi there.", at=said)
        await bot.say("By the way, I don't eat meat at all.", at=said + timedelta(minutes=1))
        await bot.say("/new", at=said + timedelta(minutes=2))
        await bot.say("Am I vegetarian?", at=datetime.now(UTC))

    shown = memory_section(server)
    assert "The user is vegetarian." in shown, shown


async def test_a_fact_consolidation_found_is_dated_by_the_messages_it_came_from(
    tmp_path: Path, server: FakeLLMServer
) -> None:
    """A fact a consolidation found was dated when the consolidation ran, not when it was said: messages
    consolidated after the user said something newer (a long session compacted days later, a backlog,
    a consolidation a kill left for the next start) made "The user is vegetarian." read as newer than
    "I started eating fish again." said in between, an outdated fact shown as the latest."""

    server.responder = consolidation_finds(
        {"type": "preference", "content": "The user is vegetarian.", "confidence": 0.6}, "vegetarian"
    )
    said = datetime.now(UTC) - timedelta(days=20)  # retired now: as a compaction days later would
    async with chat(tmp_path / "ws", server) as bot:
        server.script(FakeReply(text="Noted."))
        await bot.say("I'm vegetarian.", at=said)
        await bot.say("/new", at=said + timedelta(minutes=1))
        server.script(FakeReply(text="Noted."))
        await bot.say("I started eating fish again.", at=said + timedelta(days=10))
        await bot.say("/new", at=said + timedelta(days=10, minutes=1))
        await bot.say("Am I vegetarian?", at=datetime.now(UTC))

    shown = memory_section(server)
    assert f"- [preference, {said:%Y-%m-%d}] The user is vegetarian." in shown, shown


async def test_a_correction_said_after_the_clock_stepped_back_is_recalled_as_the_current_fact(
    tmp_path: Path, server: FakeLLMServer
) -> None:
    """The machine's clock stepped back ten minutes (an NTP correction, a Raspberry Pi that started before
    NTP): "I moved to Berlin." was dated by it, before "I live in Lisbon.", and memory showed Lisbon as
    where the user lives, Berlin as what they said before. (A /new between them leaves the chat's
    history empty, not its memory.)"""
    machine = [DAY]
    async with chat(tmp_path / "ws", server, clock=lambda: machine[0]) as bot:
        server.script(FakeReply(text="Noted."), FakeReply(text="Noted."))
        await bot.say_on("I live in Lisbon.", 0)
        await bot.say_on("/new", 0, minute=1)
        machine[0] = DAY - timedelta(minutes=10)
        await bot.say_on("I moved to Berlin.", 0, minute=2)
        await bot.say_on("/new", 0, minute=3)
        await bot.say_on("Where do I live?", 0, minute=4)

    shown = memory_section(server)
    assert "I moved to Berlin." in shown and "I live in Lisbon." in shown, shown
    assert shown.index("I moved to Berlin.") < shown.index("previously") < shown.index("I live in Lisbon."), (
        shown
    )
