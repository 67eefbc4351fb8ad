"""ContextBuildingSystem: base prompt + memory, never touching the session."""

from __future__ import annotations

from pathlib import Path

from bot.domain import InboundMessage, Message, Role, Session
from bot.memory.prompt import READING_NOTE
from pipeline.base import Turn
from pipeline.context import ContextBuildingSystem
from tests.bot.memory.conftest import Clock, make_memory

NOW = "Current date and time: 2024-05-20 09:30 (Monday), UTC."


def turn_for(text: str) -> Turn:
    session = Session.new("cli", "me")
    session.append(Message(Role.USER, text))
    return Turn(session=session, inbound=(InboundMessage("cli", "me", "me", text),), now=Clock().now)


async def test_prompt_is_base_plus_memory_and_session_is_untouched(tmp_path: Path) -> None:
    memory = await make_memory(tmp_path, Clock())
    await memory.longterm.update(lambda _: "- user is called Sam\n")
    system = ContextBuildingSystem(memory, "You are membot.")
    turn = turn_for("hello")

    assert system.should_process(turn)
    await system.process(turn)

    assert (
        turn.system_prompt
        == f"You are membot.\n\n# Memory\n\n{NOW}\n\n{READING_NOTE}\n\n## Long-term Memory\n- user is called Sam"
    )
    assert turn.memory_context.startswith("# Memory")
    assert "memory" in turn.diagnostics
    assert [m.content for m in turn.session.messages] == ["hello"] and turn.new_messages == []


async def test_without_memory_the_base_prompt_is_used(tmp_path: Path) -> None:
    turn = turn_for("hello")
    await ContextBuildingSystem(None, "You are membot.  ").process(turn)
    assert turn.system_prompt == "You are membot."


async def test_empty_memory_adds_only_the_turns_date(tmp_path: Path) -> None:
    memory = await make_memory(tmp_path, Clock())
    turn = turn_for("hello")
    await ContextBuildingSystem(memory, "Base.").process(turn)
    assert turn.system_prompt == f"Base.\n\n{NOW}" and turn.memory_context == NOW


def test_order_and_skip_when_answered() -> None:
    system = ContextBuildingSystem(None, "x")
    turn = turn_for("hi")
    turn.reply = "already answered"
    assert system.order == 20 and not system.should_process(turn)
