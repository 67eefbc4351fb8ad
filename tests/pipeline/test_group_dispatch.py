"""Group chats through the real bot (``bot.app.build_core``): its dispatcher, pipeline and memory, with
the fake model server's requests as the record of what reached the model."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from bot.app import Core, build_core
from bot.config import load_settings
from bot.domain import InboundMessage
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.recording import RecordingChannel

MODEL = "gpt-4.1-mini"
GROUP = "-100777"


class Group:
    """A Telegram group of a bot built by ``build_core``, over a recording channel."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.channel = RecordingChannel(core.dispatcher.submit, "telegram")
        core.dispatcher.attach(self.channel)
        self._ids = 0

    def message(self, user_id: str, name: str, text: str, *, chat: str = GROUP) -> InboundMessage:
        self._ids += 1
        group = chat.startswith("-")
        return InboundMessage(
            "telegram", chat, user_id, text, sender_name=name, message_id=str(self._ids), is_group=group
        )

    async def say(self, user_id: str, name: str, text: str, *, chat: str = GROUP) -> str:
        """Send ``text`` and return the reply to it."""
        count = len(self.channel.sent)
        await self.core.dispatcher.submit(self.message(user_id, name, text, chat=chat))
        return (await self.channel.wait_for(count + 1))[count].text


@contextlib.asynccontextmanager
async def group_bot(workspace: Path, llm: FakeLLMServer, **overrides: Any) -> AsyncIterator[Group]:
    values: dict[str, Any] = {
        "workspace": workspace,
        "llm": {"model": MODEL, "openai": {"base_url": llm.openai_base_url, "api_key": "sk-test-key-123456"}},
        **overrides,
    }
    settings = await asyncio.to_thread(load_settings, None, env_file=None, overrides=values)
    async with build_core(settings) as core:
        yield Group(core)


async def wait_until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not predicate():
            await asyncio.sleep(0.01)


def recalled(llm: FakeLLMServer) -> str:
    """The memory pack of the last request's system prompt (without today's notes)."""
    system = llm.requests[-1].body["messages"][0]["content"]
    assert isinstance(system, str)
    return system.partition("## Relevant Memory")[2].partition("## Today's Notes")[0]


async def test_a_question_collected_with_another_members_message_finds_its_own_askers_memory(
    tmp_path: Path, server: FakeLLMServer
) -> None:
    """Collect mode answers messages queued during a turn together. Memory took the turn's last sender
    as the one who asked: Alice's "what is my job?" answered together with Bob's "ok" found Bob's job,
    not hers."""
    async with group_bot(tmp_path / "ws", server, memory={"embeddings": "none"}) as bot:
        server.script(FakeReply(text="Noted."), FakeReply(text="Noted."))
        await bot.say("1", "Alice", "I work as a nurse.")
        await bot.say("2", "Bob", "I work as a pilot.")
        await bot.say("2", "Bob", "/new")
        held = asyncio.Event()
        server.script(FakeReply(text="Hi Carol!", hold=held))
        count = len(bot.channel.sent)
        await bot.core.dispatcher.submit(bot.message("3", "Carol", "Hello everyone"))
        await wait_until(lambda: server.in_flight == 1)
        await bot.core.dispatcher.submit(bot.message("1", "Alice", "What is my job?"))
        await bot.core.dispatcher.submit(bot.message("2", "Bob", "ok"))
        held.set()
        await bot.channel.wait_for(count + 2)

    asked = server.requests[-1].body["messages"][-1]["content"]
    assert asked == "Alice: What is my job?\n\nBob: ok"  # one turn, each message under its sender
    assert "- user: Alice: I work as a nurse." in recalled(server)


async def test_what_a_private_chat_told_reaches_a_group_marked_as_from_another_chat(
    tmp_path: Path, server: FakeLLMServer
) -> None:
    """Workspace memory is shared by every chat: Alice's "I work as a nurse." in her private chat reached
    the group as "- user: I work as a nurse.", which reads as the asking member's own words, so Bob's
    "what is my job?" could be answered "a nurse". In a group it is now marked with the chat it was said
    in; in that private chat itself it reads as before."""
    async with group_bot(tmp_path / "ws", server, memory={"embeddings": "none"}) as bot:
        server.script(FakeReply(text="Noted."), FakeReply(text="Not sure."), FakeReply(text="A nurse."))
        await bot.say("1", "Alice", "I work as a nurse.", chat="1")  # her private chat with the bot
        await bot.say("2", "Bob", "What is my job?")
        in_group, system = recalled(server), server.requests[-1].body["messages"][0]["content"]
        await bot.say("1", "Alice", "/new", chat="1")
        await bot.say("1", "Alice", "What is my job?", chat="1")
        in_private = recalled(server)

    assert "- user [in another chat: telegram:1]: I work as a nurse." in in_group
    assert "- user: I work as a nurse." not in in_group
    assert "A memory marked as from another chat was said there" in system
    assert "- user: I work as a nurse." in in_private and "another chat" not in in_private
