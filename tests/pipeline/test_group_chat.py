"""A group chat through intake, memory and the prompt: the model and memory know who said what."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from bot.config import MemorySettings
from bot.domain import SPEAKER_META, InboundMessage, Message, Role, Session
from bot.intake import user_message
from pipeline.base import Turn
from pipeline.context import GROUP_NOTE, ContextBuildingSystem
from pipeline.memory_persist import MemoryPersistSystem
from tests.bot.memory.conftest import Clock, make_memory

GROUP = "-100777"


def said(name: str, user_id: str, text: str, *, group: bool = True) -> InboundMessage:
    return InboundMessage(
        "telegram", GROUP if group else user_id, user_id, text, sender_name=name, is_group=group
    )


async def answered(
    persist: MemoryPersistSystem, session: Session, inbound: InboundMessage, clock: Clock
) -> None:
    """A turn as the dispatcher runs it: the message through intake, an answer, memory persisted."""
    inbound = InboundMessage(
        inbound.channel, inbound.chat_id, inbound.sender_id, inbound.text,
        sender_name=inbound.sender_name, is_group=inbound.is_group, timestamp=clock.now,
    )  # fmt: skip
    session.append(user_message(inbound))
    turn = Turn(session=session, inbound=(inbound,), now=clock.now)
    turn.add_message(Message(Role.ASSISTANT, "Noted.", timestamp=clock.now))
    turn.reply = "Noted."
    await persist.process(turn)
    await asyncio.gather(*turn.writes)
    clock.now += timedelta(hours=1)


def test_a_group_message_starts_with_its_senders_name_and_a_private_one_does_not() -> None:
    group = user_message(said("Alice\nSmith:", "1", "I live in Berlin"))
    private = user_message(said("Alice", "1", "I live in Berlin", group=False))

    assert group.content == "Alice Smith: I live in Berlin"  # one line: a name cannot pass for text
    assert group.meta[SPEAKER_META] == "Alice Smith"
    assert private.content == "I live in Berlin" and SPEAKER_META not in private.meta


async def test_memory_keeps_who_said_what_in_a_group(tmp_path: Path) -> None:
    clock = Clock()
    memory = await make_memory(tmp_path, clock)
    persist = MemoryPersistSystem(memory, MemorySettings())
    context = ContextBuildingSystem(memory, "You are membot.")
    session = Session.new("telegram", GROUP)
    await answered(persist, session, said("Alice", "1", "I live in Berlin."), clock)
    await answered(persist, session, said("Bob", "2", "I live in Paris now."), clock)

    later = Session.new("telegram", GROUP)  # a fresh session: what follows comes from memory alone
    question = said("Carol", "3", "Where do Alice and Bob live?")
    later.append(user_message(question))
    turn = Turn(session=later, inbound=(question,), now=clock.now)
    await context.process(turn)
    await memory.close()

    assert GROUP_NOTE in turn.system_prompt
    shown = turn.memory_context
    assert "Alice: I live in Berlin" in shown and "Bob: I live in Paris" in shown
    # Bob moving is not news about where Alice lives: her statement is current, not "previously".
    assert "previously" not in shown


async def test_a_private_chat_has_no_group_note(tmp_path: Path) -> None:
    clock = Clock()
    memory = await make_memory(tmp_path, clock)
    context = ContextBuildingSystem(memory, "You are membot.")
    session = Session.new("telegram", "1")
    question = said("Alice", "1", "Hello", group=False)
    session.append(user_message(question))
    turn = Turn(session=session, inbound=(question,), now=clock.now)
    await context.process(turn)
    await memory.close()

    assert GROUP_NOTE not in turn.system_prompt


async def test_my_job_in_a_group_is_the_askers_own(tmp_path: Path) -> None:
    clock = Clock()
    memory = await make_memory(tmp_path, clock)
    persist = MemoryPersistSystem(memory, MemorySettings())
    context = ContextBuildingSystem(memory, "You are membot.")
    session = Session.new("telegram", GROUP)
    await answered(persist, session, said("Alice", "1", "I work as a nurse."), clock)
    clock.now += timedelta(days=2)

    shown = {}
    for name, user_id in (("Alice", "1"), ("Bob", "2")):
        later = Session.new("telegram", GROUP)
        question = said(name, user_id, "What is my job?")  # no word in common with her statement
        later.append(user_message(question))
        turn = Turn(session=later, inbound=(question,), now=clock.now)
        await context.process(turn)
        shown[name] = turn.memory_context.split("## Recent Context")[0]  # recall, not the group's notes
    await memory.close()

    assert "Alice: I work as a nurse" in shown["Alice"]
    assert "nurse" not in shown["Bob"]  # her job is not his


async def test_a_group_member_the_platform_gave_no_name_is_still_someone_of_their_own(tmp_path: Path) -> None:
    """Named by their id: what they said is theirs, not the group's (another member's "my job")."""
    assert user_message(said(" ", "3", "hi")).content == "user 3: hi"
    clock = Clock()
    memory = await make_memory(tmp_path, clock)
    persist = MemoryPersistSystem(memory, MemorySettings())
    context = ContextBuildingSystem(memory, "You are membot.")
    await answered(persist, Session.new("telegram", GROUP), said("", "3", "I work as a nurse."), clock)
    clock.now += timedelta(days=2)

    later = Session.new("telegram", GROUP)
    question = said("Bob", "2", "What is my job?")
    later.append(user_message(question))
    turn = Turn(session=later, inbound=(question,), now=clock.now)
    await context.process(turn)
    await memory.close()

    assert "nurse" not in turn.memory_context.split("## Recent Context")[0]
