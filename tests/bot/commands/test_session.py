"""/status, /compact, /new and /stop end to end: dispatcher + pipeline + real LLM client + fake server.

The channel is a recording implementation of the Channel ABC; memory is the real MemoryService.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest

from bot.catalog import ModelCatalog
from bot.commands import CommandRouter
from bot.commands.session import COMPACT_USAGE, Admins, SessionCommands
from bot.compaction import SUMMARY_PREFIX, CompactionService, MemoryRetirer
from bot.config import CompactionSettings, DispatcherSettings, MemorySettings, ToolSettings
from bot.context_budget import ContextBudget
from bot.dispatcher import Dispatcher
from bot.domain import InboundMessage, Role
from bot.inbox import Inbox
from bot.memory import MemoryService
from bot.memory import operator as memory_operator
from bot.model_wait import WAIT_FILE, WaitRecords
from bot.session_service import SessionService
from bot.sessions import JsonSessionStore
from bot.tokens import TokenCounter
from bot.tools import ToolRegistry
from bot.tools.base import Tool
from bot.usage import UsageLedger
from channels.telegram.inbound import PasteJoiner
from pipeline import Pipeline
from pipeline.compaction import AutoCompactionSystem
from pipeline.tool_loop import ToolLoopSystem
from pipeline.usage import UsageSystem
from tests.channels.telegram.kit import break_folder
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.recording import RecordingChannel, SlowTool, StreamingChannel
from tests.session_kit import conversation, llm_client, tool_exchange

MODEL = "gpt-4.1-mini"
SID = "test:c1"
OPERATOR = Admins(frozenset({("test", "u1")}))  # u1 is an admin: /status shows the day's spend


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter.offline(model=MODEL, provider="openai")


class Bot:
    """A small membot: the same parts and wiring as bot/app.py, over a temporary workspace."""

    def __init__(
        self,
        root: Path,
        server: FakeLLMServer,
        catalog: ModelCatalog,
        http: httpx.AsyncClient,
        counter: TokenCounter,
        *,
        consolidation_timeout: float = 5.0,
        mode: str = "collect",
        tools: Sequence[Tool] = (),
        turn_timeout: float = 600.0,
        dispatcher: dict[str, float] | None = None,
        llm: dict[str, Any] | None = None,
        streaming: bool = False,
        admins: Admins = Admins(),
    ) -> None:
        self.root = root
        self.ledger = UsageLedger(root / "usage.json", tz=ZoneInfo("UTC"))
        self.llm = llm_client(server, catalog, http, model=MODEL, usage=self.ledger, **(llm or {}))
        self.sessions = SessionService(JsonSessionStore(root / "sessions"))
        self.memory = MemoryService(
            root / "memory",
            MemorySettings(consolidation_timeout=consolidation_timeout),
            llm=self.llm,
        )
        retirer = MemoryRetirer(self.memory, timeout=consolidation_timeout)
        settings = CompactionSettings()
        self.compaction = CompactionService(
            self.llm,
            counter,
            retirer,
            settings,
            summary_model=catalog.for_tier("balanced", "openai", default=MODEL),
        )
        info = catalog.get(MODEL)
        self.budget = ContextBudget(
            counter,
            self.compaction,
            retirer,
            settings,
            window=info.max_input_tokens,
            max_output_tokens=info.max_output_tokens,
            memory_cap=200,
        )
        tool_settings = ToolSettings(enabled=[t.name for t in tools])
        registry = ToolRegistry(tools, tool_settings)
        pipeline = Pipeline(
            [
                AutoCompactionSystem(self.budget),
                ToolLoopSystem(self.llm, registry, tool_settings, budget=self.budget),
                UsageSystem(self.budget, None),  # the client reports every call to the ledger
            ]
        )
        router = CommandRouter()
        commands = SessionCommands(
            self.sessions,
            self.budget,
            model=info,
            tier=catalog.tier_of(MODEL),
            ledger=self.ledger,
            admins=admins,
            memory_stats=lambda: memory_operator.stats(self.memory),
        )
        router.add("status", "Model, context, usage and memory of this chat", commands.status)
        router.add("compact", "Summarize older messages now: /compact [N] keeps the last N", commands.compact)
        router.add("new", "Save this conversation to memory and start a fresh one", commands.new)
        self.dispatcher = Dispatcher(
            pipeline,
            self.sessions,
            router,
            DispatcherSettings(mode=mode, turn_timeout=turn_timeout, **(dispatcher or {})),  # type: ignore[arg-type]
            inbox=Inbox(root / "inbox"),
            waits=WaitRecords(root / "state" / WAIT_FILE),
        )
        kind = StreamingChannel if streaming else RecordingChannel  # streaming: answers are streamed
        self.channel = kind(self.dispatcher.submit)
        self.dispatcher.attach(self.channel)
        self.grace = 5.0  # seconds the shutdown lets running work finish (0: cut it, as a kill would)

    async def __aenter__(self) -> Bot:
        await self.memory.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.dispatcher.close(grace=self.grace)
        await self.memory.close()

    async def say(self, text: str, *, sender: str = "u1", is_group: bool = False) -> str:
        """Send a message and return the next reply."""
        count = len(self.channel.sent)
        await self.dispatcher.submit(InboundMessage("test", "c1", sender, text, is_group=is_group))
        sent = await self.channel.wait_for(count + 1)
        return sent[count].text

    async def on_disk(self) -> list[tuple[Role, str]]:
        fresh = await JsonSessionStore(self.root / "sessions").load(SID)
        assert fresh is not None
        return [(m.role, m.content) for m in fresh.messages]


@pytest.fixture
def bot_on(
    tmp_path: Path,
    server: FakeLLMServer,
    catalog: ModelCatalog,
    http: httpx.AsyncClient,
    counter: TokenCounter,
) -> Callable[..., Bot]:
    """A Bot on this test's workspace and fakes: ``async with bot_on(tools=[...]) as bot``."""
    return lambda **options: Bot(tmp_path, server, catalog, http, counter, **options)


async def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


# ---- /status --------------------------------------------------------------------------------------


async def test_status_figures_match_the_real_usage(
    tmp_path: Path,
    server: FakeLLMServer,
    catalog: ModelCatalog,
    counter: TokenCounter,
    bot_on: Callable[..., Bot],
) -> None:
    async with bot_on(admins=OPERATOR) as bot:
        await asyncio.to_thread((tmp_path / "memory" / "MEMORY.md").write_text, "- likes tea\n")
        server.script(FakeReply(text="one", usage=(1200, 30)), FakeReply(text="two", usage=(1500, 40)))
        assert await bot.say("first") == "one"
        assert await bot.say("second") == "two"
        status = await bot.say("/status")

    session = await bot.sessions.get(SID)
    assert session is not None
    usage = session.usage
    assert (usage.input_tokens, usage.output_tokens, usage.calls) == (2700, 70, 2)
    cost = catalog.get(MODEL).cost(usage)
    assert usage.cost_usd == pytest.approx(cost)
    lines = status.splitlines()
    assert lines[0] == f"Model: GPT-4.1 mini ({MODEL}, balanced tier)"
    assert "Messages: 4" in lines
    assert f"This chat: 2,700 in / 70 out tokens · ${cost:.4f}" in lines
    assert f"Today (all chats): 2,700 in / 70 out tokens · ${cost:.4f} · 2 calls" in lines
    assert f"  by use: chat 2 calls ${cost:.4f}" in lines
    assert "Compactions: 0" in lines and "Queue: 0 waiting · idle" in lines
    context = next(line for line in lines if line.startswith("Context:"))
    used = await bot.compaction.counter.count_history(session)
    assert re.fullmatch(r"Context: ≈\d+ / 1\.01M tokens \(0%\)", context)
    assert int(context.split("≈")[1].split()[0]) >= used
    assert any(line.startswith("Memory: MEMORY.md 12 B · items 0 episodic") for line in lines)
    assert lines[-1].startswith("Uptime: ")
    assert len(status) < 600  # readable on a phone
    assert len(server.requests) == 2  # commands never reach the model


async def test_status_says_when_an_answer_waits_for_the_disk(bot_on: Callable[..., Bot]) -> None:
    """/status said "idle" while the chat's answer waited for a full disk to take its save."""
    async with bot_on() as bot:
        await bot.say("first")
        repair = break_folder(bot.root / "sessions")  # every save fails, as on a full disk
        assert "cannot save our conversation right now" in await bot.say("held at its save")
        status = await bot.say("/status")
        repair()
        answer = (await bot.channel.wait_for(4))[3]
    assert "Queue: 0 waiting · waiting for the server's disk to save this chat" in status
    assert answer.text == "echo: held at its save"


async def test_status_of_a_new_chat_whose_session_cannot_be_read_says_it_waits_for_the_disk(
    bot_on: Callable[..., Bot],
) -> None:
    """With the sessions folder unusable, a new chat's first message crashed its turn, and /status
    failed on the same read ("/status failed")."""
    async with bot_on() as bot:
        repair = break_folder(bot.root / "sessions")  # no session can be read or written
        assert "can't read our conversation right now" in await bot.say("hello")
        status = await bot.say("/status")
        repair()
        answer = (await bot.channel.wait_for(3))[2]
    assert "failed" not in status
    assert "Messages: unknown for now (the server's disk cannot be read)" in status
    assert "Queue: 0 waiting · waiting for the server's disk to read this chat" in status
    assert answer.text == "echo: hello"


async def test_status_shows_the_operators_spend_to_admins_in_private_only(
    server: FakeLLMServer, bot_on: Callable[..., Bot]
) -> None:
    """/status showed every admitted user the day's cost across all chats and its split by purpose:
    the operator's spend. A plain user now sees their own chat's tokens, no money; an admin sees it
    all in a private chat, and nothing of the day in a group, where everyone reads the answer."""
    async with bot_on(admins=Admins(frozenset({("test", "op")}))) as bot:
        server.script(FakeReply(text="one", usage=(1200, 30)))
        assert await bot.say("first") == "one"
        plain = await bot.say("/status")
        admin = await bot.say("/status", sender="op")
        in_group = await bot.say("/status", sender="op", is_group=True)

    assert "This chat: 1,200 in / 30 out tokens" in plain.splitlines()
    assert "$" not in plain and "Today" not in plain and "by use" not in plain
    assert "Today" not in in_group and "$" not in in_group
    assert any(line.startswith("This chat: 1,200 in / 30 out tokens · $") for line in admin.splitlines())
    assert any(
        line.startswith("Today (all chats): 1,200 in / 30 out tokens · $") for line in admin.splitlines()
    )
    assert "  by use: chat 1 call $" in admin


async def test_status_with_a_ledger_from_a_newer_membot_says_the_day_is_unknown(
    tmp_path: Path, bot_on: Callable[..., Bot]
) -> None:
    """A refused usage.json (a newer membot's) must not take /status down, nor read as a quiet day."""
    newer = json.dumps({"version": 2, "days": {}})
    (tmp_path / "usage.json").write_text(newer)
    async with bot_on(admins=OPERATOR) as bot:
        assert await bot.say("hello") == "echo: hello"
        status = await bot.say("/status")
    assert "Today (all chats): unknown (the usage ledger cannot be read; see the log)" in status
    assert "This chat: " in status and "failed" not in status
    assert (tmp_path / "usage.json").read_text() == newer


async def test_status_counts_every_model_call_by_purpose(
    server: FakeLLMServer,
    bot_on: Callable[..., Bot],
) -> None:
    # A session of answers, a /compact (summary + consolidation of what it removed) and a /new
    # (consolidation): every call the provider bills must be in today's figures.
    async with bot_on(admins=OPERATOR) as bot:
        for text in ("first", "second", "third"):
            await bot.say(text)
        assert (await bot.say("/compact 2")).startswith("Compacted")
        assert await bot.say("/new") == "Session cleared."
        status = await bot.say("/status")
        today, split = await bot.ledger.day(), await bot.ledger.purposes()

    billed = len(server.requests)
    assert today.calls == billed == 6
    assert {name: u.calls for name, u in split.items()} == {"chat": 3, "compaction": 1, "consolidation": 2}
    assert today.input_tokens == sum(u.input_tokens for u in split.values())
    assert f"· {billed} calls" in status
    assert "  by use: chat 3 calls $" in status and "· compaction 1 call $" in status
    assert "· consolidation 2 calls $" in status


async def test_status_of_a_new_chat_and_after_a_fallback(
    server: FakeLLMServer,
    bot_on: Callable[..., Bot],
) -> None:
    async with bot_on() as bot:
        assert "Messages: 0 (no conversation yet)" in await bot.say("/status")
        session = await bot.sessions.get_or_create("test", "c1")
        for m in conversation(30):
            session.append(m)
        await bot.sessions.save(session)
        server.responder = lambda api, body: FakeReply(status=500) if "compress" in json.dumps(body) else None
        compacted = await bot.say("/compact 5")
        status = await bot.say("/status")
    # Plain words in the chat: the exception's name (LLMUnavailable) is for the log.
    reason = "the summary failed: the AI model cannot be reached right now"
    assert f"No summary ({reason})" in compacted
    assert f"Compactions: 1 (last one fell back to truncation: {reason})" in status
    assert "LLM" not in compacted + status


# ---- /compact -------------------------------------------------------------------------------------


async def test_compact_replies_with_what_it_did_and_saves(
    server: FakeLLMServer,
    bot_on: Callable[..., Bot],
) -> None:
    async with bot_on() as bot:
        assert await bot.say("/compact") == "Nothing to compact yet."
        session = await bot.sessions.get_or_create("test", "c1")
        for m in conversation(20) + tool_exchange("t", "time") + conversation(9):
            session.append(m)
        await bot.sessions.save(session)

        assert await bot.say("/compact ten") == COMPACT_USAGE
        server.responder = lambda api, body: (
            FakeReply(text="- the user counted messages") if "compress" in json.dumps(body) else None
        )
        reply = await bot.say("/compact")
        # Keeping exactly 10 would cut between a tool call and its result: the call stays too.
        assert re.fullmatch(r"Compacted: removed 20 messages, kept 11\. Tokens \d+ → \d+\.", reply)
        before, after = (int(x) for x in re.findall(r"(\d+) → (\d+)", reply)[0])
        assert after < before
        disk = await bot.on_disk()
        assert disk[0] == (Role.SYSTEM, f"{SUMMARY_PREFIX}\n- the user counted messages") and len(disk) == 12

        for out_of_range in ("/compact 0", "/compact -5", "/compact 500"):
            assert await bot.say(out_of_range) == COMPACT_USAGE
        reply = await bot.say("/compact 1")
        assert reply.startswith("Compacted: removed 11 messages, kept 1.")
        assert await bot.say("/compact 100") == "Nothing to compact: 2 messages, keeping 100."
        # The archive holds everything that left the session.
        archived = await bot.memory.archive.read(SID)
        summaries = [m for m in archived if m.content.startswith(SUMMARY_PREFIX)]
        assert len(summaries) == 1 and len(archived) == 30 + 1  # all but the last message, + summary 1


async def test_compact_when_the_model_declines_to_summarize(
    tmp_path: Path, server: FakeLLMServer, bot_on: Callable[..., Bot]
) -> None:
    """The model refuses both the summary and the consolidation of what leaves the session (OpenAI's
    ``refusal``): its refusal became the chat's summary, for every later turn, and the chat was told
    the messages were summarized. Each is a failed summary, as when its call errors."""
    server.responder = lambda api, body: (
        FakeReply(refusal="I'm sorry, but I can't help with that.")
        if "compress" in json.dumps(body) or "memory consolidation" in json.dumps(body)
        else None
    )
    async with bot_on() as bot:
        await asyncio.to_thread((tmp_path / "memory" / "MEMORY.md").write_text, "- operator fact\n")
        session = await bot.sessions.get_or_create("test", "c1")
        for m in conversation(30):
            session.append(m)
        await bot.sessions.save(session)
        reply = await bot.say("/compact 5")
        assert reply.endswith(
            "No summary (the model declined to summarize): the older messages were saved to memory and "
            "dropped."
        )
        disk = await bot.on_disk()
        status = await bot.say("/status")
    assert all("can't help" not in text for _, text in disk) and len(disk) == 5
    assert "(last one fell back to truncation: the model declined to summarize)" in status
    history = (tmp_path / "memory" / "HISTORY.md").read_text()
    assert "[raw-fallback]" in history and "declined" in history and "can't help" not in history
    assert (tmp_path / "memory" / "MEMORY.md").read_text() == "- operator fact\n"


# ---- /stop ----------------------------------------------------------------------------------------


async def test_stop_during_a_slow_model_answer_returns_quickly_and_keeps_the_session_consistent(
    server: FakeLLMServer,
    bot_on: Callable[..., Bot],
) -> None:
    async with bot_on() as bot:
        server.script(FakeReply(text="too late", delay=3))
        await bot.dispatcher.submit(InboundMessage("test", "c1", "u1", "slow question"))
        await wait_until(lambda: server.in_flight == 1)
        started = time.monotonic()
        reply = await bot.say("/stop")
        elapsed = time.monotonic() - started
        assert reply == "⏹ Stopped." and elapsed < 1.0
        assert not bot.dispatcher.is_running(SID)
        assert await bot.on_disk() == [(Role.USER, "slow question")]
        assert await bot.say("/stop") == "Nothing is running."
        # The unanswered question and the next one go to the model as one user turn (strict templates).
        assert await bot.say("again") == "echo: slow question\n\nagain"
        sent = [m["content"] for m in server.requests[-1].body["messages"]]
        assert sent == ["slow question\n\nagain"]
    assert [m.text for m in bot.channel.sent].count("too late") == 0


async def test_stop_inside_a_slow_tool_returns_quickly_and_pairs_the_call_with_a_result(
    server: FakeLLMServer,
    bot_on: Callable[..., Bot],
) -> None:
    tool = SlowTool()
    async with bot_on(tools=[tool]) as bot:
        server.script(FakeReply(tool_calls=[("slow", {})]))
        await bot.dispatcher.submit(InboundMessage("test", "c1", "u1", "use the slow tool"))
        async with asyncio.timeout(5):
            await tool.started.wait()
        started = time.monotonic()
        reply = await bot.say("/stop")
        assert reply == "⏹ Stopped." and time.monotonic() - started < 1.0
        assert tool.cancelled
        disk = await bot.on_disk()
        assert [role for role, _ in disk] == [Role.USER, Role.ASSISTANT, Role.TOOL]
        assert disk[2][1].startswith("Cancelled")
        # The next turn sends a valid history (the fake rejects a call without its result).
        assert await bot.say("and now?") == "echo: and now?"


@pytest.mark.parametrize("cut", ["/stop", "timeout"])
async def test_a_cut_short_turn_still_counts_the_model_calls_it_made(
    tmp_path: Path,
    server: FakeLLMServer,
    catalog: ModelCatalog,
    cut: str,
    bot_on: Callable[..., Bot],
) -> None:
    tool = SlowTool()
    timeout = 1.0 if cut == "timeout" else 600.0
    async with bot_on(tools=[tool], turn_timeout=timeout) as bot:
        server.script(FakeReply(tool_calls=[("slow", {})], usage=(900, 25)))
        count = len(bot.channel.sent)
        await bot.dispatcher.submit(InboundMessage("test", "c1", "u1", "use the slow tool"))
        async with asyncio.timeout(5):
            await tool.started.wait()
        if cut == "/stop":
            assert await bot.say("/stop") == "⏹ Stopped."
        else:
            (reply, *_) = (await bot.channel.wait_for(count + 1))[count:]
            assert "took longer than 1 s" in reply.text
            assert "send another message to try again" in reply.text  # a timeout may pass next time
        await wait_until(lambda: not bot.dispatcher.is_running(SID))
        today = await bot.ledger.day()
        status = await bot.say("/status")

    fresh = await JsonSessionStore(tmp_path / "sessions").load(SID)
    assert fresh is not None
    assert (fresh.usage.input_tokens, fresh.usage.output_tokens, fresh.usage.calls) == (900, 25, 1)
    assert fresh.usage.cost_usd == pytest.approx(catalog.get(MODEL).cost(fresh.usage))
    assert (today.input_tokens, today.calls) == (900, 1)
    assert "This chat: 900 in / 25 out tokens" in status


async def test_queued_messages_survive_stop_and_are_seen_by_the_next_turn(
    server: FakeLLMServer,
    bot_on: Callable[..., Bot],
) -> None:
    async with bot_on() as bot:
        server.script(FakeReply(text="too late", delay=3))
        await bot.dispatcher.submit(InboundMessage("test", "c1", "u1", "first"))
        await wait_until(lambda: server.in_flight == 1)
        await bot.dispatcher.submit(InboundMessage("test", "c1", "u1", "second"))
        await bot.dispatcher.submit(InboundMessage("test", "c1", "u1", "third"))
        reply = await bot.say("/stop")
        assert reply.startswith("⏹ Stopped. 2 queued messages kept")
        assert [c for _, c in await bot.on_disk()] == ["first", "second", "third"]
        assert await bot.say("fourth") == "echo: first\n\nsecond\n\nthird\n\nfourth"
        sent = [m["content"] for m in server.requests[-1].body["messages"]]
        assert sent == ["first\n\nsecond\n\nthird\n\nfourth"]  # one user turn
        assert len([r for r in server.requests if r.body["model"] == MODEL]) == 2


# ---- /new -----------------------------------------------------------------------------------------


async def test_new_consolidates_then_clears(
    tmp_path: Path,
    server: FakeLLMServer,
    bot_on: Callable[..., Bot],
) -> None:
    entry = {"history_entry": "The user said hello twice.", "memory_update": "- likes tea\n- says hello"}
    server.responder = lambda api, body: (
        FakeReply(text=json.dumps(entry)) if "memory consolidation" in json.dumps(body) else None
    )
    async with bot_on() as bot:
        await bot.say("hello")
        await bot.say("hello again")
        assert await bot.say("/new") == "Session cleared."
        assert await bot.on_disk() == []
        status = await bot.say("/status")
    assert "Messages: 0" in status and "This chat: 0 in / 0 out tokens" in status
    history = (tmp_path / "memory" / "HISTORY.md").read_text()
    assert "The user said hello twice." in history
    assert (tmp_path / "memory" / "MEMORY.md").read_text() == "- likes tea\n- says hello\n"


async def test_new_on_a_full_disk_clears_once_storage_returns_and_the_chat_is_told(
    bot_on: Callable[..., Bot],
) -> None:
    """/new whose save the disk refused answered "/new failed" though it had cleared the session in
    memory: the next message was answered from the cleared session, and a restart brought back the old
    one from disk."""
    async with bot_on() as bot:
        await bot.say("hello")
        repair = break_folder(bot.root / "sessions")  # every save fails, as on a full disk
        new = asyncio.create_task(bot.dispatcher.submit(InboundMessage("test", "c1", "u1", "/new")))
        notice = (await bot.channel.wait_for(2))[1]
        assert "can't save" in notice.text and notice.aside and "/new failed" not in notice.text
        status = await bot.say("/status")
        repair()
        await new
        cleared = (await bot.channel.wait_for(4))[3]
        on_disk_after_new = await bot.on_disk()
        answer = await bot.say("after")
    assert "waiting for the server's disk to save this chat" in status
    assert cleared.text == "Session cleared."
    assert on_disk_after_new == []
    assert answer == "echo: after"
    assert [c for _, c in await bot.on_disk()] == ["after", "echo: after"]
    assert len(bot.channel.sent) == 5  # told once


async def test_compact_on_a_full_disk_is_saved_once_storage_returns_and_the_chat_is_told(
    bot_on: Callable[..., Bot],
) -> None:
    """/compact whose save the disk refused answered "/compact failed" though it had compacted the
    session in memory; a restart then brought the whole conversation back from disk."""
    async with bot_on() as bot:
        for n in range(4):
            await bot.say(f"message {n}")
        sent = len(bot.channel.sent)
        repair = break_folder(bot.root / "sessions")  # every save fails, as on a full disk
        task = asyncio.create_task(bot.dispatcher.submit(InboundMessage("test", "c1", "u1", "/compact 2")))
        notice = (await bot.channel.wait_for(sent + 1))[sent]
        assert "can't save" in notice.text and notice.aside and "failed" not in notice.text
        repair()
        await task
        done = (await bot.channel.wait_for(sent + 2))[sent + 1]
        on_disk = await bot.on_disk()
    assert done.text.startswith("Compacted:"), done.text
    assert [c for _, c in on_disk][-2:] == ["message 3", "echo: message 3"] and len(on_disk) <= 3
    assert len(bot.channel.sent) == sent + 2  # told once


async def test_new_under_a_consolidation_timeout_still_clears_and_writes_the_raw_fallback(
    tmp_path: Path,
    server: FakeLLMServer,
    bot_on: Callable[..., Bot],
) -> None:
    server.responder = lambda api, body: (
        FakeReply(text="{}", delay=2) if "memory consolidation" in json.dumps(body) else None
    )
    async with bot_on(consolidation_timeout=0.3) as bot:
        await asyncio.to_thread((tmp_path / "memory" / "MEMORY.md").write_text, "- operator fact\n")
        await bot.say("remember the code 4711")
        await bot.say("and the door is blue")
        assert await bot.say("/new") == "Session cleared."
        assert await bot.on_disk() == []
        archived = await bot.memory.archive.read(SID)
    history = (tmp_path / "memory" / "HISTORY.md").read_text()
    assert "[raw-fallback]" in history and "remember the code 4711" in history
    assert [m.content for m in archived] == [
        "remember the code 4711",
        "echo: remember the code 4711",
        "and the door is blue",
        "echo: and the door is blue",
    ]
    assert (tmp_path / "memory" / "MEMORY.md").read_text() == "- operator fact\n"


async def test_status_says_memory_is_unavailable_in_plain_words(
    tmp_path: Path,
    bot_on: Callable[..., Bot],
) -> None:
    async with bot_on() as bot:
        await asyncio.to_thread((tmp_path / "memory" / "MEMORY.md").mkdir)  # unreadable as a file
        status = await bot.say("/status")
    assert "Memory: unavailable right now (the details are in the log)" in status
    assert "Error" not in status


# ---- commands racing with a turn --------------------------------------------------------------------


async def test_new_sent_during_a_turn_does_not_hold_up_a_stop_sent_after_it(
    server: FakeLLMServer,
    bot_on: Callable[..., Bot],
) -> None:
    """Channels hand a chat's messages over one at a time (here Telegram's paste joiner): a /new that
    waits for the running turn must not keep the /stop sent after it from reaching the dispatcher."""
    tool = SlowTool()
    async with bot_on(tools=[tool]) as bot:
        joiner = PasteJoiner(bot.dispatcher.submit, 0, max_chars=16000)
        server.script(FakeReply(tool_calls=[("slow", {})]))
        joiner.add(InboundMessage("test", "c1", "u1", "use the slow tool"))
        async with asyncio.timeout(5):
            await tool.started.wait()
        queued = joiner.add(InboundMessage("test", "c1", "u1", "and this"))
        new = joiner.add(InboundMessage("test", "c1", "u1", "/new"), alone=True)
        started = time.monotonic()
        stop = joiner.add(InboundMessage("test", "c1", "u1", "/stop"), alone=True)
        async with asyncio.timeout(5):
            await asyncio.gather(queued, new, stop)
        assert time.monotonic() - started < 2.0
        await wait_until(lambda: any(m.text == "Session cleared." for m in bot.channel.sent))
        texts = [m.text for m in bot.channel.sent]
        assert texts[0].startswith("⏳ /new runs once the current reply and the 1 message sent before it")
        stopped = "⏹ Stopped. 1 queued message kept in the history; your next message starts a new turn."
        assert texts.index(stopped) < texts.index("Session cleared.")
        assert await bot.on_disk() == []
        # The message sent before /new went with the old conversation, into memory.
        archived = [m.content for m in await bot.memory.archive.read(SID)]
        assert archived[0] == "use the slow tool" and archived[-1] == "and this"
        assert bot.dispatcher.total_queued() == 0
        assert await bot.say("hello") == "echo: hello"  # the fresh session works
        await joiner.close()


async def test_a_new_waiting_for_a_turn_runs_once_after_a_restart_in_its_place(
    server: FakeLLMServer,
    bot_on: Callable[..., Bot],
    tmp_path: Path,
) -> None:
    """A /new told "runs as soon as the current reply is done" was acknowledged: a stop that cuts the turn
    short (past the grace period, as a kill would) must not lose it. The next start answers the question,
    then runs the /new, then answers what was sent after it, in the fresh conversation, each once."""
    tool = SlowTool()
    async with bot_on(tools=[tool]) as before:
        server.script(FakeReply(tool_calls=[("slow", {})]))
        await before.dispatcher.submit(InboundMessage("test", "c1", "u1", "use the slow tool"))
        async with asyncio.timeout(5):
            await tool.started.wait()
        await before.dispatcher.submit(InboundMessage("test", "c1", "u1", "/new"))
        await before.dispatcher.submit(InboundMessage("test", "c1", "u1", "after the new"))
        [waiting] = await before.channel.wait_for(1)
        assert waiting.text.startswith("⏳ /new runs as soon as the current reply is done")
        before.grace = 0  # the turn and the waiting /new are cut short
    assert [m.text for m in before.channel.sent] == [waiting.text]
    async with bot_on() as after:
        assert await after.dispatcher.recover() == 3
        sent = await after.channel.wait_for(3)
        await asyncio.sleep(0.2)  # nothing more comes
        assert [m.text for m in after.channel.sent] == [
            "echo: use the slow tool",
            "Session cleared.",
            "echo: after the new",
        ]
        assert sent[1].reply_to == sent[0].reply_to or sent[1].aside  # the command's own reply
        assert await after.on_disk() == [
            (Role.USER, "after the new"),
            (Role.ASSISTANT, "echo: after the new"),
        ]
        archived = [m.content for m in await after.memory.archive.read(SID)]
        assert archived[0] == "use the slow tool" and "after the new" not in archived
    async with bot_on() as again:
        assert await again.dispatcher.recover() == 0  # done: a later start runs it no more
        await asyncio.sleep(0.1)
        assert again.channel.sent == []


async def test_status_says_how_many_calls_were_counted_by_our_estimate(
    server: FakeLLMServer, bot_on: Callable[..., Bot]
) -> None:
    """A server that sends no token counts got 0 tokens in /status; its calls are estimated now
    (bot/llm/estimates.py), and /status says how many of them."""
    async with bot_on(admins=OPERATOR) as bot:
        server.script(FakeReply(text="one", usage=(1200, 30)), FakeReply(text="two", no_usage=True))
        assert await bot.say("first") == "one"
        assert await bot.say("second") == "two"
        status = await bot.say("/status")
    session = await bot.sessions.get(SID)
    assert session is not None and session.usage.input_tokens > 1200 and session.usage.output_tokens > 30
    this_chat = next(line for line in status.splitlines() if line.startswith("This chat:"))
    today = next(line for line in status.splitlines() if line.startswith("Today (all chats):"))
    assert "out tokens (1 of 2 calls estimated) · $" in this_chat
    assert "out tokens (1 of 2 calls estimated) · $" in today
