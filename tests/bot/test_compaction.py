"""CompactionService against the fake LLM server: summary, fallbacks, memory first, pairs kept."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.catalog import ModelCatalog
from bot.compaction import (
    META_LAST,
    SUMMARY_PREFIX,
    CompactionService,
    MemoryRetirer,
    clean_summary,
    cut_index,
    is_summary,
)
from bot.config import CompactionSettings
from bot.domain import Message, Role, Session
from bot.metrics import Metrics
from bot.tokens import TokenCounter
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.session_kit import RecordingRetirer, conversation, llm_client, pairs_intact, tool_exchange

SUMMARY = "- The user prefers tea.\n- TODO: book flight AB123 to /srv/trips/plan.md by Friday."


def service(
    server: FakeLLMServer,
    catalog: ModelCatalog,
    http: httpx.AsyncClient,
    retirer: Any,
    **settings: Any,
) -> CompactionService:
    llm = llm_client(server, catalog, http)
    return CompactionService(
        llm,
        TokenCounter.approximate(),
        retirer,
        CompactionSettings(**settings),
        summary_model=catalog.for_tier("balanced", "openai", default=llm.model),
    )


def session_with(messages: list[Message]) -> Session:
    session = Session.new("test", "c1")
    for m in messages:
        session.append(m)
    return session


async def test_older_messages_become_one_summary_after_memory_saved_them(
    server: FakeLLMServer, catalog: ModelCatalog, http: httpx.AsyncClient
) -> None:
    history = conversation(6) + tool_exchange("t1", "web_fetch") + [Message(Role.USER, "x" * 1000)]
    history += conversation(14)
    session = session_with(history)
    retirer = RecordingRetirer()
    server.script(FakeReply(text=SUMMARY))
    result = await service(server, catalog, http, retirer).compact(session, keep_last=10)

    assert result.performed and not result.fallback
    assert (result.removed, result.kept) == (len(history) - 10, 10)
    assert result.tokens_after < result.tokens_before
    first = session.messages[0]
    assert first.role is Role.SYSTEM and first.content == f"{SUMMARY_PREFIX}\n{SUMMARY}"
    assert session.messages[1:] == history[-10:]
    assert session.compactions == 1 and session.rewrite_needed
    assert session.metadata[META_LAST]["fallback"] is False
    # Memory got exactly the retiring messages, while they were still in the session.
    assert retirer.retired == [history[:-10]] and retirer.still_in_session == [True]

    body = server.requests[-1].body
    assert body["model"] == "gpt-4.1-mini"  # the balanced tier, not the active gpt-4.1
    assert body["temperature"] == 0.3
    assert body["max_tokens"] == CompactionSettings().summary_max_tokens
    prompt = body["messages"][-1]["content"]
    assert "SECRET-RESULT" not in prompt  # tool results are left out
    assert "(called tools: web_fetch)" in prompt
    assert "USER: " + "x" * 299 + "…\n" in prompt and "x" * 300 not in prompt  # 300 characters each
    system = body["messages"][0]["content"]
    assert "exact identifiers" in system and "TODO" in system


async def test_a_second_compaction_merges_the_previous_summary(
    server: FakeLLMServer, catalog: ModelCatalog, http: httpx.AsyncClient
) -> None:
    session = session_with(conversation(30))
    compaction = service(server, catalog, http, RecordingRetirer())
    server.script(FakeReply(text=SUMMARY), FakeReply(text="- merged summary of everything so far"))
    await compaction.compact(session, keep_last=10)
    for m in conversation(20):
        session.append(m)
    await compaction.compact(session, keep_last=10)
    prompt = server.requests[-1].body["messages"][-1]["content"]
    assert "## Previous summary" in prompt and "AB123" in prompt
    assert [is_summary(m) for m in session.messages].count(True) == 1
    assert session.messages[0].content.endswith("merged summary of everything so far")
    assert session.compactions == 2


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (FakeReply(status=500), "failed"),
        (FakeReply(text="   "), "empty or unusable"),
        (FakeReply(text="?!?!?!?!?!?!?!?!?!?!?!?!?!"), "empty or unusable"),
        (FakeReply(text=SUMMARY, delay=1.0), "longer than 0.2 s"),
        (FakeReply(text=SUMMARY, cut_off=True), "cut at its output limit"),  # its newest facts missing
    ],
    ids=["server-error", "empty", "garbage", "timeout", "cut-off"],
)
async def test_a_failed_summary_falls_back_to_truncation(
    server: FakeLLMServer, catalog: ModelCatalog, http: httpx.AsyncClient, reply: FakeReply, reason: str
) -> None:
    history = conversation(30)
    session = session_with(history)
    retirer = RecordingRetirer()
    server.script(reply)
    result = await service(server, catalog, http, retirer, summary_timeout=0.2).compact(session, keep_last=8)
    assert result.performed and result.fallback and reason in result.reason
    assert session.messages == history[-8:]
    assert session.compactions == 1
    recorded = session.metadata[META_LAST]
    assert recorded["fallback"] is True and reason in recorded["reason"]
    assert retirer.retired == [history[:-8]]  # saved to memory all the same


@pytest.mark.parametrize(
    ("api", "reply"),
    [
        ("anthropic", FakeReply(text="- The user prefers tea.\n- TODO: book flight", stop="refusal")),
        ("openai", FakeReply(text=SUMMARY, stop="content_filter")),
        ("openai", FakeReply(refusal="I'm sorry, but I can't help with summarizing this conversation.")),
    ],
    ids=["anthropic-refusal", "content-filter", "openai-refusal-field"],
)
async def test_a_summary_the_model_declined_is_a_failed_summary(
    server: FakeLLMServer,
    catalog: ModelCatalog,
    http: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
    api: str,
    reply: FakeReply,
) -> None:
    """A model that declines to summarize (Anthropic's ``stop_reason: refusal``, a ``content_filter``,
    OpenAI's ``refusal`` text) wrote no summary, or only the start of one: its words became the
    conversation's summary, in place of the messages it was asked to keep, for every later turn. It
    is a failed summary, as one whose call errored: the log says why, and the compaction truncates."""
    model = "claude-haiku-4-5" if api == "anthropic" else "gpt-4.1-mini"
    llm = llm_client(
        server, catalog, http, model=model,
        anthropic={"base_url": server.anthropic_base_url, "api_key": "sk-ant-test"},
    )  # fmt: skip
    retirer = RecordingRetirer()
    compaction = CompactionService(
        llm, TokenCounter.approximate(), retirer, CompactionSettings(), summary_model=None
    )
    history = conversation(30)
    session = session_with(history)
    server.script(reply)

    result = await compaction.compact(session, keep_last=8)

    assert result.performed and result.fallback and "declined" in result.reason
    assert session.messages == history[-8:]  # no summary of the refusal: truncated, as after an error
    assert session.metadata[META_LAST]["fallback"] is True
    assert retirer.retired == [history[:-8]]  # saved to memory all the same
    [refused] = logged(caplog, "compaction_summary_refused")
    assert refused["model"] == model and refused["stop_reason"] == (reply.stop or "stop")


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


async def test_truncation_keeps_the_previous_summary(
    server: FakeLLMServer, catalog: ModelCatalog, http: httpx.AsyncClient
) -> None:
    summary = Message(Role.SYSTEM, f"{SUMMARY_PREFIX}\n{SUMMARY}")
    session = session_with([summary, *conversation(20)])
    server.script(FakeReply(status=503))
    result = await service(server, catalog, http, RecordingRetirer()).compact(session, keep_last=5)
    assert result.fallback
    assert session.messages[0] is summary and len(session.messages) == 6


async def test_nothing_is_removed_when_memory_cannot_save_it(
    server: FakeLLMServer, catalog: ModelCatalog, http: httpx.AsyncClient
) -> None:
    history = conversation(30)
    session = session_with(history)
    result = await service(server, catalog, http, RecordingRetirer(accept=False)).compact(session)
    assert not result.performed and "could not be saved" in result.reason
    assert session.messages == history and session.compactions == 0


class BrokenMemory:
    async def consolidate(
        self, session_id: str, messages_to_retire: Any, *, timeout: float | None = None
    ) -> Any:
        raise OSError("disk full")


async def test_memory_retirer_refuses_when_the_archive_fails() -> None:
    session = session_with(conversation(4))
    assert await MemoryRetirer(BrokenMemory(), timeout=1.0).retire(session, session.messages) is False


async def test_a_short_session_is_left_alone(
    server: FakeLLMServer, catalog: ModelCatalog, http: httpx.AsyncClient
) -> None:
    session = session_with(conversation(5))
    result = await service(server, catalog, http, RecordingRetirer()).compact(session, keep_last=10)
    assert not result.performed and server.requests == []


def test_garbage_detection() -> None:
    assert clean_summary("", 100) is None
    assert clean_summary("```\n```", 100) is None
    assert clean_summary(f"{SUMMARY_PREFIX}\n{SUMMARY}", 1000) == SUMMARY
    assert clean_summary("a" * 50, 20) == "a" * 19 + "…"


# ---- a tool call and its results are never split ----------------------------------------------------


def _group(draw: st.DrawFn, index: int) -> list[Message]:
    kind = draw(st.sampled_from(["user", "assistant", "tools"]))
    if kind == "user":
        return [Message(Role.USER, f"u{index}")]
    if kind == "assistant":
        return [Message(Role.ASSISTANT, f"a{index}")]
    names = draw(st.lists(st.sampled_from(["memory", "web_fetch", "time"]), min_size=1, max_size=4))
    return tool_exchange(f"c{index}", *names)


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    out: list[Message] = []
    if draw(st.booleans()):
        out.append(Message(Role.SYSTEM, f"{SUMMARY_PREFIX}\nolder"))
    for i in range(draw(st.integers(min_value=0, max_value=25))):
        out += _group(draw, i)
    return out


@given(histories(), st.integers(min_value=1, max_value=60))
def test_the_cut_never_separates_a_tool_call_from_its_results(history: list[Message], keep: int) -> None:
    assert pairs_intact(history)
    cut = cut_index(history, keep)
    retired, kept = history[:cut], history[cut:]
    assert pairs_intact(retired) and pairs_intact(kept)
    n = len(history)
    if cut:
        assert kept, "something must stay"
        if len(kept) < keep:  # only when moving earlier would have retired nothing
            assert all(m.role is Role.TOOL for m in history[1 : n - keep + 1])
    else:
        assert n <= keep or all(m.role is Role.TOOL for m in history[1:])


async def test_every_compaction_is_counted_as_ok_or_fallback(
    server: FakeLLMServer, catalog: ModelCatalog, http: httpx.AsyncClient
) -> None:
    metrics = Metrics()
    llm = llm_client(server, catalog, http)
    compaction = CompactionService(
        llm,
        TokenCounter.approximate(),
        RecordingRetirer(),
        CompactionSettings(),
        summary_model=llm.model,
        observer=metrics,
    )
    session = session_with(conversation(20))
    server.script(FakeReply(text=SUMMARY))
    assert not (await compaction.compact(session, keep_last=10)).fallback
    for message in conversation(20):
        session.append(message)
    server.script(FakeReply(text=""))  # an empty summary: the older messages are only trimmed
    assert (await compaction.compact(session, keep_last=10)).fallback

    counted = metrics.registry.get_sample_value
    assert counted("membot_compactions_total", {"result": "ok"}) == 1
    assert counted("membot_compactions_total", {"result": "fallback"}) == 1
