"""memory.scope = "chat" through the pipeline: persist a turn in one chat, build the prompt in another."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from bot.config import LLMSettings, MemorySettings
from bot.domain import InboundMessage, Message, Role, Session
from bot.llm import LLMClient
from pipeline.base import Turn
from pipeline.context import ContextBuildingSystem
from pipeline.memory_persist import MemoryPersistSystem
from tests.bot.memory.conftest import CATALOG, Clock, make_memory
from tests.fakes.llm_server import FakeLLMServer, FakeReply

NOW = Clock().now
OPERATOR = "- The office is in Porto\n"


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLMServer]:
    async with FakeLLMServer() as server:
        yield server


@pytest.fixture
async def llm(fake_llm: FakeLLMServer) -> AsyncIterator[LLMClient]:
    base = {"openai": {"base_url": fake_llm.openai_base_url, "api_key": "sk-test"}, "max_retries": 0}
    async with httpx.AsyncClient() as http:
        yield LLMClient(LLMSettings.model_validate(base), CATALOG, http)


async def remembered(persist: MemoryPersistSystem, turn: Turn) -> None:
    """What the dispatcher does: run the system, then wait for the writes it left on the turn."""
    await persist.process(turn)
    await asyncio.gather(*turn.writes)


def answered(session: Session, user: str, answer: str) -> Turn:
    session.append(Message(Role.USER, user, timestamp=NOW))
    turn = Turn(session=session, inbound=(InboundMessage(session.channel, "me", "me", user),), now=NOW)
    turn.add_message(Message(Role.ASSISTANT, answer, timestamp=NOW))
    turn.reply = answer
    return turn


def asking(session: Session, user: str) -> Turn:
    session.append(Message(Role.USER, user, timestamp=NOW))
    # A fixed time: the prompt's "Current date and time" line held "42" at minute 42 of every hour.
    return Turn(session=session, inbound=(InboundMessage(session.channel, "me", "me", user),), now=NOW)


async def test_what_chat_a_says_never_reaches_chat_bs_prompt(
    tmp_path: Path, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    settings = {"scope": "chat", "memory_window": 4, "keep_recent": 2}
    memory = await make_memory(tmp_path, Clock(), llm, **settings)
    (memory.root / "MEMORY.md").write_text(OPERATOR)
    update = "- A's user flies to Lisbon in June\n"
    fake_llm.script(FakeReply(text=json.dumps({"history_entry": "Trip talk.", "memory_update": update})))
    persist = MemoryPersistSystem(memory, MemorySettings.model_validate(settings))
    context = ContextBuildingSystem(memory, "You are membot.")
    chat_a, chat_b = Session.new("telegram", "-100123"), Session.new("discord", "42")

    await remembered(persist, answered(chat_a, "Remember that my passport number ends in 42.", "Noted."))
    await remembered(persist, answered(chat_a, "I fly to Lisbon in June.", "Have a good trip!"))
    await remembered(persist, answered(chat_a, "Thanks!", "You're welcome."))  # 6 > 4: consolidates A
    await memory.close()

    a_turn, b_turn = asking(chat_a, "passport number? Lisbon?"), asking(chat_b, "passport number? Lisbon?")
    await context.process(a_turn)
    await context.process(b_turn)

    assert (memory.root / "MEMORY.md").read_text() == OPERATOR
    assert "## This Chat's Memory\n- A's user flies to Lisbon in June" in a_turn.system_prompt
    assert "ends in 42" in a_turn.system_prompt
    assert "## Long-term Memory\n- The office is in Porto" in b_turn.system_prompt
    for secret in ("42", "Lisbon", "passport number ends", "This Chat's Memory", "Today's Notes"):
        assert secret not in b_turn.system_prompt.replace("passport number? Lisbon?", "")
    await memory.close()
