"""The circuit breaker: a model of the chain that keeps failing with an outage is asked last for a
cool-down, end to end through the real client against the fake server, on an injected clock."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from bot.admin import AdminServer, health_report
from bot.catalog import ModelCatalog
from bot.config import AdminSettings, LLMSettings
from bot.domain import Message, Role
from bot.errors import LLMUnavailable
from bot.llm import ChatRequest, LLMClient
from bot.llm.breaker import COOL_DOWN, OPEN_AFTER
from bot.metrics import Metrics
from tests.bot.llm.conftest import Sleeps
from tests.bot.test_admin import sample
from tests.fakes.llm_server import FakeLLMServer, FakeReply

PRIMARY, FALLBACK = "gpt-4.1-mini", "claude-haiku-4-5"
REQUEST = ChatRequest(messages=(Message(Role.USER, "x"),))


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Outage:
    """Every request for one of ``models`` gets ``status`` while ``down``; the rest are echoed."""

    def __init__(self, server: FakeLLMServer, *models: str, status: int = 503) -> None:
        self.down = True
        self.server = server
        server.responder = lambda api, body: (
            FakeReply(status=status) if self.down and body["model"] in models else None
        )

    def asked(self, model: str) -> int:
        return sum(r.body["model"] == model for r in self.server.requests)


def client(
    server: FakeLLMServer, http: httpx.AsyncClient, catalog: ModelCatalog, clock: Clock, **settings: Any
) -> LLMClient:
    values: dict[str, Any] = {
        "model": PRIMARY,
        "openai": {"base_url": server.openai_base_url, "api_key": "sk-test-openai"},
        "anthropic": {"base_url": server.anthropic_base_url, "api_key": "sk-ant-test"},
        "max_retries": 2,
        **settings,
    }
    return LLMClient(LLMSettings.model_validate(values), catalog, http, sleep=Sleeps(), clock=clock)


async def ask(llm: LLMClient, stream: bool) -> str:
    if not stream:
        return (await llm.chat(REQUEST)).content
    events = [event async for event in llm.stream(REQUEST)]
    assert events[-1].response is not None
    return events[-1].response.content


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_primary_that_keeps_failing_is_asked_last_for_a_cool_down(
    server: FakeLLMServer,
    http: httpx.AsyncClient,
    catalog: ModelCatalog,
    caplog: pytest.LogCaptureFixture,
    stream: bool,
) -> None:
    """During a primary's outage every turn paid its tries (and their timeouts) before the fallback
    answered. After two calls that failed with an outage it is skipped; when the cool-down ends one
    call tries it again (failing, the cool-down doubles), and its first success closes the breaker."""
    clock = Clock()
    llm = client(server, http, catalog, clock, fallback_models=[FALLBACK])
    outage = Outage(server, PRIMARY)
    tries = 3  # max_retries 2

    for _ in range(OPEN_AFTER):
        assert await ask(llm, stream) == "echo: x"
    assert outage.asked(PRIMARY) == OPEN_AFTER * tries
    [opened] = logged(caplog, "llm_model_skipped")
    assert opened["model"] == PRIMARY and opened["cool_down"] == COOL_DOWN
    assert set(llm.stats.skipped) == {PRIMARY}

    for _ in range(3):  # skipped: the fallback answers at once
        assert await ask(llm, stream) == "echo: x"
    assert outage.asked(PRIMARY) == OPEN_AFTER * tries and outage.asked(FALLBACK) == OPEN_AFTER + 3

    clock.now += COOL_DOWN  # one call tries it again: still down, so it is skipped for twice as long
    assert await ask(llm, stream) == "echo: x"
    assert outage.asked(PRIMARY) == (OPEN_AFTER + 1) * tries
    clock.now += COOL_DOWN
    assert await ask(llm, stream) == "echo: x"
    assert outage.asked(PRIMARY) == (OPEN_AFTER + 1) * tries

    outage.down = False
    clock.now += COOL_DOWN  # twice the cool-down since the last try: it is asked, and answers
    assert await ask(llm, stream) == "echo: x"
    assert server.requests[-1].body["model"] == PRIMARY
    assert await ask(llm, stream) == "echo: x"
    assert [r.body["model"] for r in server.requests[-2:]] == [PRIMARY, PRIMARY]
    [closed] = logged(caplog, "llm_model_back")
    assert closed["model"] == PRIMARY
    assert len(logged(caplog, "llm_model_skipped")) == 1  # once each
    assert llm.stats.skipped == {}


async def test_a_single_model_is_always_asked(
    server: FakeLLMServer, http: httpx.AsyncClient, catalog: ModelCatalog
) -> None:
    """With no other model to ask, a call waits for the one there is, as before (the turn then waits
    for the model: bot/model_wait.py); so does a call for a named model (a summary's)."""
    clock = Clock()
    outage = Outage(server, PRIMARY)
    alone = client(server, http, catalog, clock)
    named = client(server, http, catalog, clock, fallback_models=[FALLBACK])
    for call in range(1, 5):
        with pytest.raises(LLMUnavailable):
            await alone.chat(REQUEST)
        with pytest.raises(LLMUnavailable):
            await named.chat(ChatRequest(messages=REQUEST.messages, model=PRIMARY))
        assert outage.asked(PRIMARY) == call * 2 * 3
    assert outage.asked(FALLBACK) == 0


@pytest.mark.parametrize("status", [400, 401, 404, 429])
async def test_a_model_that_answers_is_not_skipped(
    server: FakeLLMServer,
    http: httpx.AsyncClient,
    catalog: ModelCatalog,
    caplog: pytest.LogCaptureFixture,
    status: int,
) -> None:
    """Only an outage (5xx, a timeout, no connection) opens the breaker: a server that refuses a request,
    a key or a model, or rate-limits it, is there, and says why each time."""
    llm = client(server, http, catalog, Clock(), fallback_models=[FALLBACK], max_retries=0)
    outage = Outage(server, PRIMARY, status=status)
    for call in range(1, 5):
        assert await ask(llm, stream=False) == "echo: x"
        assert outage.asked(PRIMARY) == call
    assert logged(caplog, "llm_model_skipped") == [] and llm.stats.skipped == {}


async def test_a_skipped_model_is_still_asked_when_the_others_fail(
    server: FakeLLMServer, http: httpx.AsyncClient, catalog: ModelCatalog, caplog: pytest.LogCaptureFixture
) -> None:
    """The fallback fails too (its key is refused): the skipped primary is asked after it, so its
    outage is what the turn waits for, and its return is noticed at the next call, not a cool-down
    later."""
    clock = Clock()
    llm = client(server, http, catalog, clock, fallback_models=[FALLBACK], max_retries=0)
    outage = Outage(server, PRIMARY)
    server.responder = lambda api, body: (
        FakeReply(status=401) if api == "anthropic" else FakeReply(status=503) if outage.down else None
    )
    for _ in range(OPEN_AFTER + 1):
        with pytest.raises(LLMUnavailable) as info:
            await llm.chat(REQUEST)
        assert info.value.model == PRIMARY
    assert [r.body["model"] for r in server.requests[-2:]] == [FALLBACK, PRIMARY]  # asked last
    assert set(llm.stats.skipped) == {PRIMARY}
    outage.down = False
    assert (await llm.chat(REQUEST)).content == "echo: x"
    assert llm.stats.skipped == {} and len(logged(caplog, "llm_model_back")) == 1


async def test_healthz_names_the_skipped_model(
    server: FakeLLMServer, http: httpx.AsyncClient, catalog: ModelCatalog
) -> None:
    llm = client(server, http, catalog, Clock(), fallback_models=[FALLBACK], max_retries=0)
    Outage(server, PRIMARY)
    for _ in range(OPEN_AFTER):
        await llm.chat(REQUEST)
    _, body = health_report({}, llm.stats, uptime=1.0)
    assert body["llm"]["reachable"] is True  # the fallback answers
    assert list(body["llm"]["skipped_models"]) == [PRIMARY]


async def test_metrics_show_the_skipped_model_while_it_is_skipped(
    server: FakeLLMServer, http: httpx.AsyncClient, catalog: ModelCatalog
) -> None:
    """/metrics had no sign of a skipped model: an operator could alert on failures, not on a primary
    the breaker keeps out of the chain. ``membot_llm_model_skipped{model}`` is 1 while it is skipped,
    and gone once it is back."""
    clock = Clock()
    llm = client(server, http, catalog, clock, fallback_models=[FALLBACK], max_retries=0)
    outage = Outage(server, PRIMARY)
    metrics = Metrics()
    metrics.watch(llm_stats=lambda: llm.stats)
    admin = AdminServer(
        AdminSettings(enabled=True, port=0), metrics, channels=dict, llm_stats=lambda: llm.stats
    )
    async with admin, httpx.AsyncClient(base_url=f"http://127.0.0.1:{admin.port}") as scraper:
        await llm.chat(REQUEST)
        before = (await scraper.get("/metrics")).text
        for _ in range(OPEN_AFTER - 1):
            await llm.chat(REQUEST)
        during = (await scraper.get("/metrics")).text
        outage.down = False
        clock.now += COOL_DOWN
        await llm.chat(REQUEST)
        after = (await scraper.get("/metrics")).text
    assert sample(before, "membot_llm_model_skipped", model=PRIMARY) is None  # one outage: not yet
    assert sample(during, "membot_llm_model_skipped", model=PRIMARY) == 1
    assert sample(during, "membot_llm_model_skipped", model=FALLBACK) is None
    assert "# TYPE membot_llm_model_skipped gauge" in during
    assert sample(after, "membot_llm_model_skipped", model=PRIMARY) is None
