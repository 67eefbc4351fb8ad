"""AutoCompactionSystem in a real pipeline (ToolLoop + UsageSystem) over the fake LLM server.

The active model is a small-window test model from an operator's models file (not the shipped one),
so the threshold is reached with a few dozen messages. Sessions are filled relative to the context
budget's compaction limit (threshold × what the window leaves once the answer's room is reserved).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest

from bot.catalog import ModelCatalog, load_catalog
from bot.compaction import META_LAST, SUMMARY_PREFIX, CompactionService
from bot.config import CompactionSettings, ToolSettings
from bot.context_budget import META_OVERHEAD, ContextBudget
from bot.domain import InboundMessage, Message, Role, Session
from bot.llm import LLMClient
from bot.tokens import META_RATIO, RATIO_BOUNDS, TokenCounter
from bot.tools import ToolRegistry
from bot.usage import UsageLedger
from pipeline import Pipeline, Turn
from pipeline.compaction import DIAG_ESTIMATE, AutoCompactionSystem
from pipeline.tool_loop import ToolLoopSystem
from pipeline.usage import UsageSystem
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.session_kit import RecordingRetirer, conversation, llm_client, pairs_intact, tool_exchange

TINY = "tiny-test"
WINDOW = 2000
SYSTEM_PROMPT = "You are a test bot. Answer briefly."
OVERFLOW = {
    "error": {
        "message": "This model's maximum context length is 2000 tokens.",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
}


class StaticPrompt:
    """Stands in for ContextBuilding (order 20): a fixed system prompt."""

    name, order, enabled = "context", 20, True

    def should_process(self, turn: Turn) -> bool:
        return True

    async def process(self, turn: Turn) -> None:
        turn.system_prompt = SYSTEM_PROMPT


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> ModelCatalog:
    models = tmp_path_factory.mktemp("models") / "models.json"
    entry = {"id": TINY, "provider": "openai", "max_input_tokens": WINDOW, "max_output_tokens": 256}
    models.write_text(json.dumps({"version": 1, "models": [entry]}))
    return load_catalog(models)


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter.offline(model=TINY, provider="openai")


class Rig:
    def __init__(
        self,
        server: FakeLLMServer,
        catalog: ModelCatalog,
        http: httpx.AsyncClient,
        counter: TokenCounter,
        tmp_path: Path,
        **compaction: Any,
    ) -> None:
        settings = CompactionSettings(**compaction)
        self.llm: LLMClient = llm_client(server, catalog, http, model=TINY)
        self.retirer = RecordingRetirer()
        self.service = CompactionService(
            self.llm,
            counter,
            self.retirer,
            settings,
            summary_model=catalog.for_tier("balanced", "openai", default=TINY),
        )
        self.budget = ContextBudget(
            counter,
            self.service,
            self.retirer,
            settings,
            window=WINDOW,
            max_output_tokens=catalog.get(TINY).max_output_tokens,
            base_prompt=SYSTEM_PROMPT,
        )
        self.auto = AutoCompactionSystem(self.budget)
        self.ledger = UsageLedger(tmp_path / "usage.json", tz=ZoneInfo("UTC"))
        tools = ToolSettings()
        loop = ToolLoopSystem(
            self.llm,
            ToolRegistry([], tools),
            tools,
            budget=self.budget,
            max_overflow_retries=settings.max_overflow_retries,
        )
        self.pipeline = Pipeline([self.auto, StaticPrompt(), loop, UsageSystem(self.budget, self.ledger)])

    async def turn(self, session: Session, text: str) -> Turn:
        """What the dispatcher does: the user's message goes into the session, then the pipeline runs."""
        session.append(Message(Role.USER, text))
        return await self.pipeline.run(Turn(session, (InboundMessage("test", "c1", "u1", text),)))


@pytest.fixture
def rig(
    server: FakeLLMServer,
    catalog: ModelCatalog,
    http: httpx.AsyncClient,
    counter: TokenCounter,
    tmp_path: Path,
) -> Rig:
    """The compaction path with the default settings (a test with others makes its own :class:`Rig`)."""
    return Rig(server, catalog, http, counter, tmp_path)


def filled(counter: TokenCounter, tokens: int) -> Session:
    """A session whose history is about ``tokens`` basis tokens, with a tool exchange inside."""
    session = Session.new("test", "c1")
    for m in tool_exchange("early", "web_fetch", "time"):
        session.append(m)
    i = 0
    while counter.history_tokens(session) < tokens:
        for m in conversation(2, words=30):
            m.content = f"[{i}] {m.content}"
            session.append(m)
        i += 1
    return session


def is_summary_request(body: dict[str, Any]) -> bool:
    return body["model"] == "gpt-4.1-mini"


async def test_compacts_before_the_call_when_the_threshold_is_crossed(
    server: FakeLLMServer, counter: TokenCounter, rig: Rig
) -> None:
    session = filled(counter, int(rig.budget.limit * 1.05))
    server.script(FakeReply(text="- summary: numbered chat about w0..w29"), FakeReply(text="fresh answer"))

    turn = await rig.turn(session, "the new question")

    assert turn.reply == "fresh answer" and not turn.failures
    assert [is_summary_request(r.body) for r in server.requests] == [True, False]
    sent = server.requests[1].body["messages"]
    # The summary is folded into the one system message (strict chat templates refuse a second).
    assert sent[0]["role"] == "system" and sent[0]["content"].startswith(
        f"{SYSTEM_PROMPT}\n\n{SUMMARY_PREFIX}"
    )
    assert [m["role"] for m in sent].count("system") == 1
    assert sent[-1] == {"role": "user", "content": "the new question"}
    assert session.compactions == 1 and session.metadata[META_LAST]["trigger"] == "threshold"
    assert turn.diagnostics[DIAG_ESTIMATE] <= rig.budget.limit
    assert pairs_intact([m for m in session.messages if m.role is not Role.SYSTEM])
    assert rig.retirer.still_in_session == [True]


async def test_below_the_threshold_nothing_happens(
    server: FakeLLMServer, counter: TokenCounter, rig: Rig
) -> None:
    session = filled(counter, int(rig.budget.limit * 0.6))
    before = len(session.messages)
    turn = await rig.turn(session, "hello")
    assert turn.reply == "echo: hello" and len(server.requests) == 1
    assert session.compactions == 0 and len(session.messages) == before + 2


async def test_an_overflow_error_compacts_and_the_retry_succeeds(
    server: FakeLLMServer, counter: TokenCounter, rig: Rig
) -> None:
    session = filled(counter, int(rig.budget.limit * 0.75))  # we think it fits; the provider disagrees
    server.script(
        FakeReply(status=400, error=OVERFLOW),
        FakeReply(text="- summary of the early chat"),
        FakeReply(text="answer after compaction"),
    )
    turn = await rig.turn(session, "question")

    assert turn.reply == "answer after compaction" and not turn.failures
    assert [is_summary_request(r.body) for r in server.requests] == [False, True, False]
    retry = server.requests[2].body["messages"]
    assert SUMMARY_PREFIX in retry[0]["content"] and retry[0]["role"] == "system"
    assert len(retry) < len(server.requests[0].body["messages"])
    assert session.metadata[META_LAST]["trigger"] == "overflow"
    assert session.metadata[META_RATIO] > counter.prior  # our estimate fell short: it was raised


async def test_overflow_retries_are_bounded(
    server: FakeLLMServer,
    catalog: ModelCatalog,
    http: httpx.AsyncClient,
    counter: TokenCounter,
    tmp_path: Path,
) -> None:
    rig = Rig(server, catalog, http, counter, tmp_path, max_overflow_retries=3)
    session = filled(counter, int(rig.budget.limit * 0.75))
    server.responder = lambda api, body: (
        FakeReply(text="- a summary of it all")
        if is_summary_request(body)
        else FakeReply(status=400, error=OVERFLOW)
    )
    turn = await rig.turn(session, "question")
    chats = [r for r in server.requests if not is_summary_request(r.body)]
    assert turn.reply is None and turn.failures and "LLMContextOverflow" in turn.failures[-1].error
    assert 2 <= len(chats) <= 4  # the first try and at most 3 retries
    # each retry made room: a compaction, or (nothing left to compact) the raised estimate's trim
    assert 1 <= session.compactions <= len(chats) - 1


async def test_a_failing_summarizer_falls_back_to_truncation_and_the_turn_goes_on(
    server: FakeLLMServer,
    catalog: ModelCatalog,
    http: httpx.AsyncClient,
    counter: TokenCounter,
    tmp_path: Path,
) -> None:
    rig = Rig(server, catalog, http, counter, tmp_path, keep_last=6)
    session = filled(counter, int(rig.budget.limit * 1.1))
    tail = session.messages[-5:]
    server.responder = lambda api, body: FakeReply(status=500) if is_summary_request(body) else None
    turn = await rig.turn(session, "still there?")
    assert turn.reply == "echo: still there?"
    assert session.metadata[META_LAST]["fallback"] is True
    assert not any(m.role is Role.SYSTEM for m in session.messages)
    assert session.messages[:5] == tail  # plain truncation: the last messages, oldest dropped


async def test_usage_is_accounted_and_the_ratio_follows_the_api(
    server: FakeLLMServer, catalog: ModelCatalog, counter: TokenCounter, rig: Rig
) -> None:
    session = filled(counter, int(rig.budget.limit * 0.75))
    prompt_raw = (
        counter.history_tokens(session) + counter.count_text("q") + 4 + counter.count_text(SYSTEM_PROMPT)
    )
    actual = int(prompt_raw * 1.3)
    server.script(FakeReply(text="ok", usage=(actual, 7)))
    turn = await rig.turn(session, "q")
    assert turn.reply == "ok"
    assert (session.usage.input_tokens, session.usage.output_tokens, session.usage.calls) == (actual, 7, 1)
    info = catalog.get(TINY)
    assert session.usage.cost_usd == pytest.approx(info.cost(session.usage))
    today = await rig.ledger.day()
    assert (today.input_tokens, today.output_tokens) == (actual, 7)
    assert session.metadata[META_OVERHEAD] == counter.count_text(SYSTEM_PROMPT)
    # One sample moves the ratio 30% of the way from the prior toward the observed 1.3.
    expected = 0.7 * counter.prior + 0.3 * (actual / prompt_raw)
    assert session.metadata[META_RATIO] == pytest.approx(expected, abs=0.01)


async def test_one_absurd_token_count_does_not_set_the_ratio_to_its_bound(
    server: FakeLLMServer, counter: TokenCounter, rig: Rig
) -> None:
    """A server that reports a trillion input tokens once (a proxy's glitch, a count of the wrong
    thing) moves the ratio as far as the highest plausible count would, not to its bound at once:
    taken as it came, the one sample tripled every later estimate of the chat, which was then
    summarized long before its window was full."""
    session = filled(counter, int(rig.budget.limit * 0.75))
    server.script(FakeReply(text="ok", usage=(10**12, 7)))
    assert (await rig.turn(session, "q")).reply == "ok"
    assert session.usage.input_tokens == 10**12  # counted as reported: the bill is the provider's
    high = RATIO_BOUNDS[1]
    assert session.metadata[META_RATIO] == pytest.approx(0.7 * counter.prior + 0.3 * high, abs=0.01)
