"""The context budget's promise, checked on every request the real pipeline sends:

    request tokens + max output tokens <= the model's window

whatever the sizes of MEMORY.md, today's notes, the retrieved pack and the history — including one
message larger than the whole window. The pipeline is the production one (AutoCompaction, ContextBuilding
over a real MemoryService on disk, the ToolLoop, Usage); the model is an in-process stand-in that
records each request (an honest implementation of the ChatModel protocol, not a patch of our code).
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.compaction import CompactionService
from bot.config import CompactionSettings, MemorySettings, ToolSettings
from bot.context_budget import ContextBudget, prompt_room
from bot.domain import ImagePart, InboundMessage, Message, Role, Session, ToolCall, Usage
from bot.llm.types import ChatRequest, ChatResponse, StreamEvent
from bot.memory.recorder import Exchange
from bot.memory.service import MemoryService
from bot.tokens import META_RATIO, TokenCounter
from bot.tools import ToolRegistry
from pipeline import Pipeline, Turn
from pipeline.compaction import AutoCompactionSystem
from pipeline.context import ContextBuildingSystem
from pipeline.tool_loop import ToolLoopSystem
from pipeline.usage import UsageSystem
from tests.pipeline.test_tool_loop import AddTool
from tests.session_kit import RecordingRetirer

NOW = datetime(2024, 5, 20, 12, 0, tzinfo=UTC)
BASE = "You are membot, a helpful assistant that remembers past conversations."
OUTPUT = 1024


class RecordingModel:
    """Answers every request at once and keeps it, so the test can measure what was sent."""

    def __init__(self) -> None:
        self.requests: list[ChatRequest] = []

    async def chat(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        return ChatResponse("- a short summary of what was said.", usage=Usage(calls=1))

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        response = await self.chat(request)
        yield StreamEvent("done", response=response)


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter.offline(model="local-8k", provider="openai")


def words(n: int, seed: str) -> str:
    return " ".join(f"{seed}{i % 97}" for i in range(n))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    window=st.sampled_from([3000, 8192, 32768]),
    memory_md=st.integers(0, 12_000),
    notes=st.integers(0, 30),
    pack=st.integers(0, 30),
    history=st.lists(st.integers(1, 12_000), max_size=40),
    last=st.integers(1, 40_000),
)
async def test_every_request_and_its_answer_fit_the_window(
    counter: TokenCounter, window: int, memory_md: int, notes: int, pack: int, history: list[int], last: int
) -> None:
    model = RecordingModel()
    with tempfile.TemporaryDirectory() as tmp:
        memory = MemoryService(
            Path(tmp) / "memory", MemorySettings(), clock=lambda: NOW, count_tokens=counter
        )
        await memory.start()
        await memory.longterm.update(
            lambda _: "\n".join(f"- fact {words(12, 'm')}" for _ in range(memory_md // 80))
        )
        said = [
            Exchange("test:c", Message(Role.USER, f"zebra {words(60, 'p')}", timestamp=NOW - timedelta(days=3)),
                     Message(Role.ASSISTANT, words(80, "a"), timestamp=NOW - timedelta(days=3)))
            for _ in range(pack)
        ] + [
            Exchange("test:c", Message(Role.USER, words(50, "n"), timestamp=NOW - timedelta(hours=2)),
                     Message(Role.ASSISTANT, words(50, "b"), timestamp=NOW - timedelta(hours=2)))
            for _ in range(notes)
        ]  # fmt: skip
        await memory.record_exchanges(said)
        retirer = RecordingRetirer()
        compaction_settings = CompactionSettings()
        compaction = CompactionService(
            model, counter, retirer, compaction_settings, summary_model=None,
            max_prompt_tokens=prompt_room(window, compaction_settings.summary_max_tokens),
        )  # fmt: skip
        tools = ToolRegistry([AddTool()], ToolSettings(enabled=["add"]))
        budget = ContextBudget(
            counter, compaction, retirer, compaction_settings, window=window, max_output_tokens=OUTPUT,
            base_prompt=BASE, tools=tools.specs("test"), memory_cap=memory.default_budget(),
        )  # fmt: skip
        pipeline = Pipeline(
            [
                AutoCompactionSystem(budget),
                ContextBuildingSystem(memory, BASE, budget=budget),
                ToolLoopSystem(model, tools, ToolSettings(enabled=["add"]), budget=budget),
                UsageSystem(budget, None),
            ]
        )
        session = Session.new("test", "c")
        for i, size in enumerate(history):
            session.append(Message(Role.USER if i % 2 == 0 else Role.ASSISTANT, words(size // 6, "h")))
        question = f"zebra {words(last // 6, 'q')}"
        session.append(Message(Role.USER, question))
        turn = await pipeline.run(Turn(session, (InboundMessage("test", "c", "u", question),), now=NOW))
        await memory.close()

    assert turn.reply and not turn.failures, turn.failures
    fresh = TokenCounter.offline(model="local-8k", provider="openai")  # has counted nothing yet
    for request in model.requests:
        output = request.max_output_tokens or OUTPUT
        sent = budget.request_tokens(request, session if request.system != compaction_system() else None)
        assert sent + output <= window, (sent, output, window)
        # The budget takes the system prompt's count from its counted parts: never below a real count.
        assert counter.count_text(request.system) >= fresh.count_text(request.system)


def compaction_system() -> str:
    from bot.compaction import SUMMARY_SYSTEM

    return SUMMARY_SYSTEM


async def test_what_status_shows_is_the_request_that_was_sent_and_no_reserve(counter: TokenCounter) -> None:
    """/status counted the whole memory reserve until a turn ran (2.9k of an 8k window for an empty
    chat), and never the tool definitions (most of a short chat's request)."""
    model = RecordingModel()
    with tempfile.TemporaryDirectory() as tmp:
        memory = MemoryService(
            Path(tmp) / "memory", MemorySettings(), clock=lambda: NOW, count_tokens=counter
        )
        await memory.start()
        settings = CompactionSettings()
        compaction = CompactionService(model, counter, RecordingRetirer(), settings, summary_model=None)
        tools = ToolRegistry([AddTool()], ToolSettings(enabled=["add"]))
        budget = ContextBudget(
            counter, compaction, RecordingRetirer(), settings, window=8192, max_output_tokens=OUTPUT,
            base_prompt=BASE, tools=tools.specs("test"), memory_cap=memory.default_budget(),
        )  # fmt: skip
        pipeline = Pipeline(
            [
                ContextBuildingSystem(memory, BASE, budget=budget),
                ToolLoopSystem(model, tools, ToolSettings(enabled=["add"]), budget=budget),
                UsageSystem(budget, None),
            ]
        )
        session = Session.new("test", "c")
        session.append(Message(Role.USER, "hello there"))
        before = await budget.in_use(session)
        await pipeline.run(Turn(session, (InboundMessage("test", "c", "u", "hello there"),), now=NOW))
        after = await budget.in_use(session)
        await memory.close()

    (request,) = model.requests
    sent = budget.request_tokens(request, session)  # the request as the model counts it (calibrated)
    assert sent - 30 <= before < sent  # only the memory section (its date line, here) is not known yet
    # Now with the answer, which the next request carries; the prompt's count is its parts' (a few more).
    assert sent <= after <= sent + counter.message_tokens(session.messages[-1]) + 10
    assert await budget.estimate(session) < after  # compaction's figure leaves the tools to the reserve


async def test_a_small_window_keeps_recent_messages_and_the_turns_own_through_a_compaction(
    counter: TokenCounter,
) -> None:
    """At 8k the memory reserve left a negative share for recent messages: every compaction kept only
    the newest one, and one in the middle of a turn retired the very question being answered."""
    model = RecordingModel()
    settings = CompactionSettings()
    retirer = RecordingRetirer()
    compaction = CompactionService(model, counter, retirer, settings, summary_model=None)
    budget = ContextBudget(
        counter, compaction, retirer, settings, window=8192, max_output_tokens=OUTPUT, base_prompt=BASE,
        memory_cap=MemorySettings().pack_hard_tokens + 1000,
    )  # fmt: skip
    session = Session.new("test", "c")
    for i in range(40):
        session.append(Message(Role.USER if i % 2 == 0 else Role.ASSISTANT, f"short message number {i}"))
    assert budget.keep_for(session) > 4

    question = Message(Role.USER, f"My locker code is 4417. {words(300, 'p')}")
    session.append(question)
    turn = Turn(session, (InboundMessage("test", "c", "u", question.content),), now=NOW)
    turn.add_message(Message(Role.ASSISTANT, "", tool_calls=(ToolCall("t1", "add", "{}"),)))
    turn.add_message(Message(Role.TOOL, words(400, "r"), tool_call_id="t1", name="add"))
    assert turn.own_count() == 3
    for attempt in (1, 2, 3):  # ever harder, as the tool loop asks
        await budget.on_overflow(session, BASE, attempt, keep_at_least=turn.own_count())
    assert question in session.messages and session.messages[-2].tool_calls


@pytest.mark.parametrize("estimated", [False, True])
async def test_a_call_counted_by_our_own_estimate_does_not_calibrate(
    counter: TokenCounter, estimated: bool
) -> None:
    """A call the server sent no token counts for is counted by our counter (bot/llm/estimates.py);
    calibrating by that figure would take our own estimate for the model's count."""
    model, retirer, settings = RecordingModel(), RecordingRetirer(), CompactionSettings()
    compaction = CompactionService(
        model, counter, retirer, settings, summary_model=None, max_prompt_tokens=prompt_room(8192, 512)
    )
    budget = ContextBudget(
        counter, compaction, retirer, settings, window=8192, max_output_tokens=OUTPUT, base_prompt=BASE
    )
    session = Session.new("test", "c")
    session.append(Message(Role.USER, words(900, "h")))  # well over the tokens a sample needs
    turn = Turn(session, (InboundMessage("test", "c", "u", "h1"),), now=NOW, system_prompt=BASE)
    turn.usage = Usage(input_tokens=5000, output_tokens=40, calls=1, estimated_calls=int(estimated))
    await UsageSystem(budget, None).process(turn)
    assert (META_RATIO in session.metadata) is not estimated


@pytest.mark.parametrize("text", ["", "What is in this photo?"])
def test_a_photo_too_large_for_the_window_is_left_out_and_said_so(counter: TokenCounter, text: str) -> None:
    """A photo the window cannot hold was dropped without a word: sent alone, the message reached the
    model empty; with a caption, the model was asked about a photo it never saw."""
    settings = CompactionSettings()
    compaction = CompactionService(
        RecordingModel(), counter, RecordingRetirer(), settings, summary_model=None
    )
    budget = ContextBudget(
        counter, compaction, RecordingRetirer(), settings, window=2000, max_output_tokens=OUTPUT
    )
    photo = Message(Role.USER, text, images=(ImagePart("image/png", "iVBORw0KGgo="),))
    request = budget.fit(ChatRequest((photo,), system=BASE))
    (sent,) = request.messages
    assert not sent.images
    assert sent.content.startswith(text) and "1 image(s) left out here" in sent.content
    assert budget.request_tokens(request) + (request.max_output_tokens or 0) <= 2000


@pytest.mark.parametrize("keep", [1, 4])
@pytest.mark.parametrize("window", [1300, 1500, 2000, 3000])
def test_a_tool_result_is_never_sent_without_the_call_that_asked_for_it(
    counter: TokenCounter, keep: int, window: int
) -> None:
    """Left out oldest first down to one message, a turn's calls went and its last result stayed: a tool
    result with no call before it, which OpenAI and Anthropic refuse (400), so the turn failed. A call
    and its results now go together, and what must still go is cut in the middle instead."""
    settings = CompactionSettings()
    compaction = CompactionService(
        RecordingModel(), counter, RecordingRetirer(), settings, summary_model=None
    )
    budget = ContextBudget(
        counter, compaction, RecordingRetirer(), settings, window=window, max_output_tokens=OUTPUT
    )
    calls = (ToolCall("c1", "add", "{}"), ToolCall("c2", "add", "{}"))
    request = ChatRequest(
        (
            Message(Role.USER, f"older {words(300, 'o')}"),
            Message(Role.ASSISTANT, f"older answer {words(300, 'a')}"),
            Message(Role.USER, f"question {words(200, 'q')}"),
            Message(Role.ASSISTANT, "", tool_calls=calls),
            Message(Role.TOOL, f"first result {words(900, 'r')}", tool_call_id="c1", name="add"),
            Message(Role.TOOL, f"second result {words(900, 's')}", tool_call_id="c2", name="add"),
        ),
        system=BASE,
    )
    sent = budget.fit(request, keep=keep).messages
    asked: set[str] = set()
    for message in sent:
        asked.update(call.id for call in message.tool_calls)
        if message.role is Role.TOOL:
            assert message.tool_call_id in asked, [m.role for m in sent]
    assert sent[-1].tool_call_id == "c2"  # the turn's newest result is what is answered
