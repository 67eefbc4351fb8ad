"""LLMClient end to end against the local fake server, for both wire formats.

The fake validates requests like the real APIs (tests/fakes/llm_checks.py), so every successful call
here also proves the translator built a shape the real API would accept.
"""

from __future__ import annotations

import email.utils
import json
import time
from contextlib import aclosing
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from bot.catalog import ModelCatalog
from bot.config import LLMSettings
from bot.domain import ImagePart, Message, Role, ToolCall
from bot.errors import (
    LLMAuthError,
    LLMBadResponse,
    LLMContentFiltered,
    LLMContextOverflow,
    LLMRateLimited,
    LLMTimeout,
    LLMUnavailable,
    plain_reason,
)
from bot.llm import ChatRequest, ChatResponse, LLMClient, StreamEvent, ToolSpec
from bot.llm.stats import failure_reason
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.llm_wire import AZURE_FILTERED, pieces

both = pytest.mark.parametrize("api", ["openai", "anthropic"])
MODELS = {"openai": "gpt-4.1-mini", "anthropic": "claude-haiku-4-5"}
WEATHER = ToolSpec(
    "weather", "Weather for a city", {"type": "object", "properties": {"city": {"type": "string"}}}
)


def ask(text: str, **kw: Any) -> ChatRequest:
    return ChatRequest(messages=(Message(Role.USER, text),), system="be brief", **kw)


async def collect(llm: LLMClient, request: ChatRequest) -> tuple[list[StreamEvent], ChatResponse]:
    events = [event async for event in llm.stream(request)]
    assert events[-1].kind == "done" and events[-1].response is not None
    return events[:-1], events[-1].response


# ---- plain calls ----------------------------------------------------------------------------------


@both
async def test_plain_chat_with_usage_cost_and_stats(
    make_client: Any, server: FakeLLMServer, catalog: ModelCatalog, api: str
) -> None:
    llm, _ = make_client(api)
    server.script(FakeReply(text="hello there", usage=(1000, 50), cached_tokens=400))
    response = await llm.chat(ask("hi"))
    assert response.content == "hello there" and response.stop_reason in ("stop", "end_turn")
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (1000, 50, 400)
    info = catalog.get(MODELS[api])
    assert info.cached_input_price is not None
    expected = (600 * info.input_price + 400 * info.cached_input_price + 50 * info.output_price) / 1e6
    assert usage.cost_usd == pytest.approx(expected)
    stats = llm.stats
    assert (stats.calls, stats.failures, stats.last_ok, stats.last_model) == (1, 0, True, MODELS[api])
    assert stats.by_model[MODELS[api]].output_tokens == 50
    assert stats.last_latency is not None and stats.last_call_at is not None


@both
async def test_wire_shape_headers_and_system_placement(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    llm, _ = make_client(api, temperature=0.3)
    await llm.chat(ask("hi", max_output_tokens=100))
    recorded = server.requests[-1]
    body = recorded.body
    assert body["model"] == MODELS[api] and body["temperature"] == 0.3
    if api == "anthropic":
        assert body["system"] == "be brief" and body["max_tokens"] == 100
        assert recorded.headers["x-api-key"] == "sk-ant-test"
        assert recorded.headers["anthropic-version"] == "2023-06-01"
        assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    else:
        assert body["messages"][0] == {"role": "system", "content": "be brief"}
        assert body["max_tokens"] == 100
        assert recorded.headers["Authorization"] == "Bearer sk-test-openai"


async def test_default_reply_echoes_the_last_user_text(make_client: Any) -> None:
    llm, _ = make_client("anthropic")
    assert (await llm.chat(ask("ping"))).content == "echo: ping"


async def test_local_server_without_key_gets_no_authorization_header(
    make_client: Any, server: FakeLLMServer
) -> None:
    llm, _ = make_client("openai", model="llama3.1", openai={"base_url": server.openai_base_url})
    assert (await llm.chat(ask("hi"))).content == "echo: hi"
    assert "Authorization" not in server.requests[-1].headers
    assert llm.stats.by_model["llama3.1"].cost_usd == 0.0  # unknown model: the free local entry


async def test_official_openai_without_key_fails_before_any_request(make_client: Any) -> None:
    llm, _ = make_client("openai", openai={})
    with pytest.raises(LLMAuthError, match="MEMBOT_LLM__OPENAI__API_KEY"):
        await llm.chat(ask("hi"))


async def test_reasoning_model_gets_no_temperature_and_max_completion_tokens(
    make_client: Any, server: FakeLLMServer
) -> None:
    llm, _ = make_client("openai", model="gpt-5-mini", temperature=0.7)
    await llm.chat(ask("hi"))  # the fake answers 400 to temperature or max_tokens, like OpenAI
    body = server.requests[-1].body
    assert "temperature" not in body and body["max_completion_tokens"] > 0


async def test_anthropic_temperature_is_kept_within_its_range(
    make_client: Any, server: FakeLLMServer
) -> None:
    llm, _ = make_client("anthropic", temperature=1.5)
    await llm.chat(ask("hi"))
    assert server.requests[-1].body["temperature"] == 1.0


@both
async def test_system_messages_in_the_history(make_client: Any, server: FakeLLMServer, api: str) -> None:
    llm, _ = make_client(api)
    history = (
        Message(Role.SYSTEM, "[summary] they like tea"),
        Message(Role.ASSISTANT, "welcome back"),
        Message(Role.USER, "what do I like?"),
    )
    assert (await llm.chat(ChatRequest(messages=history, system="base"))).content == "echo: what do I like?"
    body = server.requests[-1].body
    if api == "anthropic":
        assert body["system"] == "base\n\n[summary] they like tea"
    else:
        # One system message (strict chat templates refuse a second), and a user turn first.
        assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
        assert body["messages"][0]["content"] == "base\n\n[summary] they like tea"


@both
async def test_images_reach_the_api(make_client: Any, server: FakeLLMServer, api: str) -> None:
    llm, _ = make_client(api)
    message = Message(Role.USER, "what is this?", images=(ImagePart("image/png", "iVBORw0KGgo="),))
    await llm.chat(ChatRequest(messages=(message,)))
    content = server.requests[-1].body["messages"][-1]["content"]
    if api == "anthropic":
        image = next(block for block in content if block["type"] == "image")
        assert image["source"] == {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    else:
        image = next(part for part in content if part["type"] == "image_url")
        assert image["image_url"]["url"] == "data:image/png;base64,iVBORw0KGgo="


# ---- tool calls -----------------------------------------------------------------------------------


@both
async def test_tool_call_round_trip_is_accepted_by_the_api(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    llm, _ = make_client(api)
    server.script(FakeReply(tool_calls=[("weather", {"city": "Oslo"}), ("weather", '{"city": "Rome"}')]))
    first = await llm.chat(ask("weather?", tools=(WEATHER,)))
    assert [c.name for c in first.tool_calls] == ["weather", "weather"]
    assert [json.loads(c.arguments) for c in first.tool_calls] == [{"city": "Oslo"}, {"city": "Rome"}]
    assert first.stop_reason in ("tool_calls", "tool_use")
    tools = server.requests[-1].body["tools"]
    assert len(tools) == 1 and "weather" in json.dumps(tools)
    history = (
        Message(Role.USER, "weather?"),
        Message(Role.ASSISTANT, "", tool_calls=first.tool_calls),
        *(Message(Role.TOOL, "sunny", tool_call_id=c.id, name=c.name) for c in first.tool_calls),
    )
    server.script(FakeReply(text="Both sunny."))
    second = await llm.chat(ChatRequest(messages=history, tools=(WEATHER,)))
    assert second.content == "Both sunny."  # the fake checked call ids and ordering like the real API
    if api == "anthropic":
        results = server.requests[-1].body["messages"][-1]["content"]
        assert [b["tool_use_id"] for b in results] == [c.id for c in first.tool_calls]


@both
async def test_broken_tool_history_is_repaired_not_refused(make_client: Any, api: str) -> None:
    """An interrupted call (no result) and a result whose call was compacted away still get an answer."""
    llm, _ = make_client(api)
    history = (
        Message(Role.TOOL, "old result", tool_call_id="gone", name="files"),
        Message(Role.USER, "hi"),
        Message(
            Role.ASSISTANT, "", tool_calls=(ToolCall("c1", "weather", "{not json"), ToolCall("c2", "w", "{}"))
        ),
        Message(Role.TOOL, "rain", tool_call_id="c2", name="w"),
        Message(Role.TOOL, "rain again", tool_call_id="c2", name="w"),
        Message(Role.USER, "still there?"),
    )
    answer = await llm.chat(ChatRequest(messages=history, tools=(WEATHER,)))
    # The stray second result became user text, merged with the question after it.
    assert answer.content.startswith("echo: ") and answer.content.endswith("still there?")


# ---- streaming ------------------------------------------------------------------------------------


@both
async def test_streaming_text_and_tool_calls(make_client: Any, server: FakeLLMServer, api: str) -> None:
    llm, _ = make_client(api)
    reply = FakeReply(text="streamed answer here", tool_calls=[("weather", {"city": "Paris"})], usage=(10, 5))
    server.script(reply)
    events, done = await collect(llm, ask("go", tools=(WEATHER,)))
    texts = [e.text for e in events if e.kind == "text"]
    assert "".join(texts) == "streamed answer here" and len(texts) > 1
    assert [e.text for e in events if e.kind == "tool_call"] == ["weather"]
    assert done.content == "streamed answer here"
    assert [(c.name, json.loads(c.arguments)) for c in done.tool_calls] == [("weather", {"city": "Paris"})]
    assert (done.usage.input_tokens, done.usage.output_tokens) == (10, 5)
    assert done.usage.cost_usd > 0 and llm.stats.calls == 1
    if api == "openai":
        assert server.requests[-1].body["stream_options"] == {"include_usage": True}


@both
async def test_a_unicode_line_separator_sent_raw_stays_inside_its_text(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    # Valid JSON may carry U+2028 and U+0085 unescaped; only CR and LF end an event stream's lines.
    llm, _ = make_client(api)
    server.script(FakeReply(text="one\u2028two\x85three", raw_unicode=True))
    _, done = await collect(llm, ask("x"))
    assert done.content == "one\u2028two\x85three"


async def test_openai_parallel_tool_call_deltas_are_joined_by_index(
    make_client: Any, server: FakeLLMServer
) -> None:
    llm, _ = make_client("openai")
    server.script(FakeReply(tool_calls=[("a", {"x": 1, "long": "y" * 30}), ("b", '{"z": 2}')]))
    _, done = await collect(llm, ask("go"))
    assert [(c.name, json.loads(c.arguments)) for c in done.tool_calls] == [
        ("a", {"x": 1, "long": "y" * 30}),
        ("b", {"z": 2}),
    ]
    assert all(c.id.startswith("call_") for c in done.tool_calls)


@both
async def test_mid_stream_failure_after_output_is_raised_not_retried(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    llm, sleeps = make_client(api)
    server.script(FakeReply(text="a fairly long answer that will break", stream_error_after=1))
    seen: list[StreamEvent] = []
    with pytest.raises(LLMUnavailable):
        async for event in llm.stream(ask("x")):
            seen.append(event)
    assert [e.kind for e in seen] == ["text"]
    assert sleeps.calls == [] and len(server.requests) == 1
    assert llm.stats.last_ok is False


async def test_anthropic_error_event_before_output_is_retried(
    make_client: Any, server: FakeLLMServer
) -> None:
    llm, sleeps = make_client("anthropic")
    server.script(FakeReply(text="x", stream_error_after=0), FakeReply(text="second try"))
    _, done = await collect(llm, ask("x"))
    assert done.content == "second try" and len(sleeps.calls) == 1


async def test_anthropic_mid_stream_invalid_request_is_a_bad_response(
    make_client: Any, server: FakeLLMServer
) -> None:
    llm, sleeps = make_client("anthropic")
    server.script(FakeReply(text="abc", stream_error_after=0, stream_error="invalid_request_error"))
    with pytest.raises(LLMBadResponse, match="mid-answer"):
        await collect(llm, ask("x"))
    assert sleeps.calls == []


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ({"code": 401, "message": "User not found."}, LLMAuthError),
        ({"code": "403", "message": "Key disabled"}, LLMAuthError),
        ({"code": 429, "message": "Rate limit exceeded"}, LLMRateLimited),
        ({"code": 400, "message": "This model's maximum context length is 8192 tokens"}, LLMContextOverflow),
        ({"code": "server_error", "message": "Provider disconnected unexpectedly"}, LLMUnavailable),
        ({"type": "overloaded_error", "code": None, "message": "Overloaded"}, LLMUnavailable),
    ],
)
async def test_an_openai_error_chunk_mid_stream_is_classified_by_its_status_code(
    make_client: Any, server: FakeLLMServer, error: dict[str, Any], kind: type[Exception]
) -> None:
    """OpenRouter and LiteLLM end a stream that failed after HTTP 200 with a chunk holding an ``error``
    whose ``code`` is the HTTP status. Classified as any 500, a revoked key (401) was retried and then
    waited for during an hour, and a prompt too long (400) never compacted."""
    llm, sleeps = make_client("openai", max_retries=1)
    server.script(FakeReply(text="abc", stream_error_after=0, openai_error=error), FakeReply(text="again"))
    if kind is LLMUnavailable or kind is LLMRateLimited:
        _, done = await collect(llm, ask("x"))  # retried: the next answer comes whole
        assert done.content == "again" and len(sleeps.calls) == 1
        assert next(iter(llm.stats.failures_by)) == (MODELS["openai"], failure_reason(kind("x")))
        return
    with pytest.raises(kind, match="mid-answer"):
        await collect(llm, ask("x"))
    assert sleeps.calls == [] and len(server.requests) == 1


async def test_a_whole_openai_answer_ended_by_finish_reason_error_did_not_come_whole(
    make_client: Any, server: FakeLLMServer
) -> None:
    """OpenRouter and LiteLLM end an answer whose model failed in the middle of it with
    ``finish_reason: "error"``, not always with an error object. Taken as complete, its first half
    went to the chat (or into a summary) as if it were all; another try may bring it whole."""
    llm, sleeps = make_client("openai", max_retries=1)
    server.script(FakeReply(text="The answer is", stop="error"), FakeReply(text="The answer is 42."))
    response = await llm.chat(ask("x"))
    assert response.content == "The answer is 42." and len(sleeps.calls) == 1
    assert next(iter(llm.stats.failures_by)) == (MODELS["openai"], "unavailable")


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ({"code": 401, "message": "User not found."}, LLMAuthError),
        ({"code": 502, "message": "Provider returned error"}, LLMUnavailable),
    ],
)
async def test_a_whole_openai_answer_with_an_error_in_its_choice_is_that_error(
    make_client: Any, server: FakeLLMServer, error: dict[str, Any], kind: type[Exception]
) -> None:
    """OpenRouter puts the error of an answer that failed after HTTP 200 in ``choices[0].error``:
    classified as the same error in a stream is (by its ``code``), not taken for an answer."""
    llm, sleeps = make_client("openai", max_retries=1)
    server.script(FakeReply(text="abc", stop="error", openai_error=error), FakeReply(text="whole"))
    if kind is LLMUnavailable:
        assert (await llm.chat(ask("x"))).content == "whole" and len(sleeps.calls) == 1
        return
    with pytest.raises(kind):
        await llm.chat(ask("x"))
    assert sleeps.calls == [] and len(server.requests) == 1


async def test_a_streamed_openai_answer_ended_by_finish_reason_error_did_not_come_whole(
    make_client: Any, server: FakeLLMServer
) -> None:
    """The same end of a streamed answer: before its first words it is tried again; after them it is
    raised as the outage it is (the turn waits for the model), not finished as if whole."""
    llm, sleeps = make_client("openai", max_retries=1)
    server.script(FakeReply(stop="error"), FakeReply(text="whole"))
    _, done = await collect(llm, ask("x"))
    assert done.content == "whole" and len(sleeps.calls) == 1
    server.script(FakeReply(text="The answer is", stop="error"))
    with pytest.raises(LLMUnavailable, match="did not come whole"):
        await collect(llm, ask("x"))


@pytest.mark.parametrize("stream", [False, True])
async def test_a_prompt_azure_filtered_is_declined_not_retried(
    make_client: Any, server: FakeLLMServer, stream: bool
) -> None:
    """Azure OpenAI refuses a prompt its content filter flags with a 400 ``code: content_filter``:
    it read as "an answer that could not be used". It is its own error, never tried again on the
    same model (the next model of the chain may answer it: one try each)."""
    llm, sleeps = make_client("openai", max_retries=3, fallback_models=["gpt-4o-mini"])
    server.responder = lambda api, body: FakeReply(status=400, error=AZURE_FILTERED)
    with pytest.raises(LLMContentFiltered, match="content filter") as info:
        await (collect(llm, ask("x")) if stream else llm.chat(ask("x")))
    assert plain_reason(type(info.value)) == "the AI provider's content filter declined this request"
    assert sleeps.calls == [] and len(server.requests) == 2  # one per model of the chain
    assert (MODELS["openai"], "content_filter") in llm.stats.failures_by


@both
async def test_a_stream_that_ends_in_the_middle_of_an_event_was_cut_not_malformed(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    """A body that ends properly but inside an event (half a JSON chunk, no blank line after it): the
    connection or a proxy gave up, so it is an answer that did not come whole (LLMUnavailable: retried
    before the first words, waited for after them), not malformed JSON from the model's server."""
    llm, sleeps = make_client(api)
    server.script(FakeReply(text="never seen", cut_after=1), FakeReply(text="second try"))
    events, done = await collect(llm, ask("x"))
    assert done.content == "second try" and len(sleeps.calls) == 1
    assert "".join(e.text for e in events if e.kind == "text") == "second try"

    text_events = 2 if api == "openai" else 4  # (the role chunk; message_start, ping, block start)
    server.script(FakeReply(text="a fairly long answer that breaks", cut_after=text_events))
    seen: list[StreamEvent] = []
    with pytest.raises(LLMUnavailable, match="ended the stream before the answer was complete"):
        async for event in llm.stream(ask("x")):
            seen.append(event)
    assert [e.kind for e in seen] == ["text"]


async def test_an_anthropic_stream_that_ends_after_its_stop_reason_is_a_whole_answer(
    make_client: Any, server: FakeLLMServer
) -> None:
    """A stream that ended after ``message_delta`` (with its ``stop_reason``) but before ``message_stop``
    was taken as cut and asked for again: the same answer paid twice. Every block was closed and the
    stop reason said why it ended: it is taken, and the missing ``message_stop`` logged."""
    llm, sleeps = make_client("anthropic")
    answer = "the whole answer, every word of it"
    # message_start, ping, the text block's start, its deltas, its stop, then message_delta
    before_stop = 3 + len(pieces(answer)) + 2
    server.script(FakeReply(text=answer, usage=(20, 7), end_after=before_stop), FakeReply(text="paid twice"))
    with capture_logs() as logs:
        events, done = await collect(llm, ask("x"))
    assert done.content == answer and done.stop_reason == "end_turn"
    assert (done.usage.input_tokens, done.usage.output_tokens) == (20, 7)
    assert len(server.requests) == 1 and sleeps.calls == []
    assert "".join(e.text for e in events if e.kind == "text") == answer
    ended = [e for e in logs if e["event"] == "llm_stream_without_message_stop"]
    assert [(e["model"], e["stop_reason"]) for e in ended] == [(MODELS["anthropic"], "end_turn")]


async def test_an_anthropic_stream_that_ends_before_its_stop_reason_is_still_cut(
    make_client: Any, server: FakeLLMServer
) -> None:
    """Ended before ``message_delta``, nothing says the answer was whole: cut, as before (after its
    first words: LLMUnavailable to the caller, which waits and asks again)."""
    llm, _ = make_client("anthropic")
    answer = "an answer that may go on"
    before_delta = 3 + len(pieces(answer)) + 1
    server.script(FakeReply(text=answer, end_after=before_delta))
    with pytest.raises(LLMUnavailable, match="ended the stream before the answer was complete"):
        await collect(llm, ask("x"))


@both
@pytest.mark.parametrize("stream", [False, True])
async def test_a_web_page_in_place_of_the_answer_names_the_base_url_to_check(
    make_client: Any, server: FakeLLMServer, api: str, stream: bool
) -> None:
    """A base URL that points at a chat UI (or a proxy's login page) gets HTTP 200 and HTML: the error
    said only "malformed JSON", with nothing to fix; it says which setting to check."""
    llm, sleeps = make_client(api)
    page = "<!DOCTYPE html>\n<html><head><title>Open WebUI</title></head><body></body></html>"
    server.script(FakeReply(html=page))
    setting = f"MEMBOT_LLM__{api.upper()}__BASE_URL"
    with pytest.raises(LLMBadResponse, match=f"with a web page \\(HTML\\).*check that {setting}"):
        await (collect(llm, ask("x")) if stream else llm.chat(ask("x")))
    assert sleeps.calls == []


async def test_an_answer_with_no_choice_is_asked_for_again(make_client: Any, server: FakeLLMServer) -> None:
    """OpenRouter answers HTTP 200 with an empty ``choices`` now and then, when the provider it routed
    to produced nothing; sent again, the request is usually answered. Read as an answer without the
    expected fields, it was not tried again and the chat was told at once that the answer could not
    be used."""
    llm, sleeps = make_client("openai", max_retries=2)
    server.script(FakeReply(no_choices=True), FakeReply(text="there it is"))
    assert (await llm.chat(ask("x"))).content == "there it is"
    assert len(sleeps.calls) == 1 and len(server.requests) == 2
    server.script(*[FakeReply(no_choices=True)] * 3)
    with pytest.raises(LLMUnavailable, match="no choice"):  # the chat waits for the model
        await llm.chat(ask("x"))


@both
async def test_streamed_malformed_json_is_a_bad_response(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    llm, _ = make_client(api)
    server.script(FakeReply(text="hi", malformed=True))
    with pytest.raises(LLMBadResponse, match="malformed"):
        await collect(llm, ask("x"))


@both
async def test_stream_fails_over_before_the_first_delta(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    other = "anthropic" if api == "openai" else "openai"
    llm, sleeps = make_client(api, max_retries=1, fallback_models=[MODELS[other]])
    server.script(FakeReply(status=503), FakeReply(status=503), FakeReply(text="from the fallback"))
    _, done = await collect(llm, ask("x"))
    assert done.content == "from the fallback"
    assert [r.api for r in server.requests] == [api, api, other]
    assert llm.stats.failovers == 1 and len(sleeps.calls) == 1


async def test_leaving_a_stream_early_closes_it(make_client: Any, server: FakeLLMServer) -> None:
    llm, _ = make_client("openai")
    server.script(FakeReply(text="one two three four five six"))
    async with aclosing(llm.stream(ask("x"))) as events:
        async for event in events:
            assert event.kind == "text"
            break
    assert (await llm.chat(ask("again"))).content == "echo: again"


# ---- errors, retries, failover --------------------------------------------------------------------


@both
async def test_rate_limit_honours_retry_after(make_client: Any, server: FakeLLMServer, api: str) -> None:
    llm, sleeps = make_client(api)
    server.script(FakeReply(status=429, headers={"retry-after": "2.5"}), FakeReply(text="ok"))
    assert (await llm.chat(ask("x"))).content == "ok"
    assert sleeps.calls == [2.5]
    assert (llm.stats.retries, llm.stats.failures, llm.stats.calls) == (1, 1, 1)
    assert llm.stats.failures_by == {(MODELS[api], "rate_limited"): 1}


async def test_retry_after_ms_wins_and_a_hint_past_the_cap_is_not_tried_early(
    make_client: Any, server: FakeLLMServer
) -> None:
    """Retried after ``llm.retry_max_delay`` when the server asked for longer, the request was refused
    again (and counted against the limit) up to ``max_retries`` times while the chat waited in silence.
    It goes to the next model instead; after the last one the turn waits as long as the server said."""
    llm, sleeps = make_client("openai", retry_max_delay=1.0, fallback_models=["gpt-4o-mini"])
    server.script(
        FakeReply(status=429, headers={"retry-after-ms": "150", "retry-after": "9"}),
        FakeReply(status=503, headers={"retry-after": "60"}),
        FakeReply(text="ok"),
    )
    assert (await llm.chat(ask("x"))).content == "ok"
    assert sleeps.calls == [0.15]
    assert [r.body["model"] for r in server.requests] == ["gpt-4.1-mini", "gpt-4.1-mini", "gpt-4o-mini"]

    alone, sleeps = make_client("anthropic", retry_max_delay=1.0)
    server.script(FakeReply(status=429, headers={"retry-after": "30"}))
    with pytest.raises(LLMRateLimited) as info:
        await alone.chat(ask("x"))
    assert info.value.retry_after == 30.0 and sleeps.calls == []


async def test_retry_after_as_an_http_date(make_client: Any, server: FakeLLMServer) -> None:
    llm, sleeps = make_client("anthropic")
    when = email.utils.formatdate(time.time() + 5, usegmt=True)
    server.script(FakeReply(status=429, headers={"retry-after": when}), FakeReply(text="ok"))
    assert (await llm.chat(ask("x"))).content == "ok"
    assert len(sleeps.calls) == 1 and 3.0 <= sleeps.calls[0] <= 5.0


@pytest.mark.parametrize("status", [500, 529, 408, 409, 502])
async def test_transient_errors_are_retried_with_exponential_backoff(
    make_client: Any, server: FakeLLMServer, status: int
) -> None:
    llm, sleeps = make_client("anthropic")
    server.script(FakeReply(status=status), FakeReply(status=status), FakeReply(text="finally"))
    assert (await llm.chat(ask("x"))).content == "finally"
    assert sleeps.calls == [0.5, 1.0]  # base 0.5 * 2**attempt * (0.5 + rng 0.5)


CLOUDFLARE_502 = (
    "<!DOCTYPE html>\n"
    + "".join(
        f'<!--[if IE {v}]> <html class="no-js ie{v} oldie" lang="en-US"> <![endif]-->\n' for v in (6, 7, 8)
    )
    + '<!--[if gt IE 8]><!--> <html class="no-js" lang="en-US"> <!--<![endif]-->\n<head>\n'
    + '<title>api.example.com | 502: Bad gateway</title>\n<meta charset="UTF-8" />\n</head><body>'
    + "<h1>Bad gateway</h1></body></html>"
)


async def test_a_proxys_error_page_is_logged_by_its_title(make_client: Any, server: FakeLLMServer) -> None:
    """A proxy in front of the model (Cloudflare, nginx) answers an outage with an HTML page. Its first
    300 characters, all the error said, were markup: the operator's log never named the proxy or what
    failed. The page's title does."""
    llm, _ = make_client("openai", max_retries=1)
    page = FakeReply(status=502, error=CLOUDFLARE_502, headers={"content-type": "text/html"})
    server.script(page, page)
    with pytest.raises(LLMUnavailable) as info:
        await llm.chat(ask("x"))
    said = str(info.value)
    assert "HTTP 502: a web page titled 'api.example.com | 502: Bad gateway'" in said
    assert "<" not in said
    once, _ = make_client("openai", max_retries=0)
    nginx = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body></body></html>"
    server.script(FakeReply(status=502, error=nginx), FakeReply(status=502, error="<p>no title</p>"))
    with pytest.raises(LLMUnavailable, match="HTTP 502: a web page titled '502 Bad Gateway'"):
        await once.chat(ask("x"))
    with pytest.raises(LLMUnavailable, match="HTTP 502: a web page \\(HTML\\) without a title"):
        await once.chat(ask("x"))


async def test_backoff_jitter_and_cap(make_client: Any, server: FakeLLMServer) -> None:
    llm, sleeps = make_client("openai", max_retries=4, retry_base_delay=1.0, retry_max_delay=5.0)
    server.script(*[FakeReply(status=500)] * 5)
    with pytest.raises(LLMUnavailable, match="HTTP 500"):
        await llm.chat(ask("x"))
    assert sleeps.calls == [1.0, 2.0, 4.0, 5.0]
    assert len(server.requests) == 5 and llm.stats.failures == 5
    assert list(llm.stats.failures_by.values()) == [5]
    assert next(iter(llm.stats.failures_by))[1] == "unavailable"


async def test_overloaded_anthropic_is_retried_and_reported_when_it_persists(
    make_client: Any, server: FakeLLMServer
) -> None:
    llm, sleeps = make_client("anthropic", max_retries=1)
    server.script(FakeReply(status=529), FakeReply(status=529))
    with pytest.raises(LLMUnavailable, match="overloaded") as info:
        await llm.chat(ask("x"))
    assert info.value.status_code == 529 and len(sleeps.calls) == 1


@both
async def test_auth_errors_are_not_retried_but_the_next_model_is_tried(
    make_client: Any, server: FakeLLMServer, api: str
) -> None:
    """Another try of the same model cannot help; a fallback (another provider, another key) can."""
    alone, sleeps = make_client(api)
    server.script(FakeReply(status=401))
    with pytest.raises(LLMAuthError, match=f"MEMBOT_LLM__{api.upper()}__API_KEY"):
        await alone.chat(ask("x"))
    assert sleeps.calls == [] and len(server.requests) == 1

    llm, sleeps = make_client(api, fallback_models=["gpt-4o-mini"])
    server.script(FakeReply(status=401))
    answer = await llm.chat(ask("x"))
    assert answer.content and sleeps.calls == [] and llm.stats.failovers == 1
    assert [r.body["model"] for r in server.requests[1:]][-1] == "gpt-4o-mini"


async def test_a_wrong_key_is_reported_by_the_real_check(
    http: httpx.AsyncClient, catalog: ModelCatalog
) -> None:
    async with FakeLLMServer(anthropic_api_key="right") as fake:
        settings = LLMSettings.model_validate(
            {
                "model": "claude-haiku-4-5",
                "anthropic": {"base_url": fake.anthropic_base_url, "api_key": "wrong"},
            }
        )
        with pytest.raises(LLMAuthError, match=r"Anthropic-compatible server .* rejected the API key"):
            await LLMClient(settings, catalog, http).chat(ask("x"))


@pytest.mark.parametrize(
    ("api", "status", "error"),
    [
        (
            "openai",
            429,
            {
                "error": {
                    "message": "You exceeded your current quota, please check your plan and billing details.",
                    "type": "insufficient_quota",
                    "code": "insufficient_quota",
                }
            },
        ),
        (
            "anthropic",
            400,
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "Your credit balance is too low to access the Anthropic API.",
                },
            },
        ),
        (
            "anthropic",
            429,
            {
                "type": "error",
                "error": {
                    "type": "rate_limit_error",
                    "message": "You have reached your specified API usage limits.",
                },
            },
        ),
    ],
)
async def test_spend_limit_is_not_retried(
    make_client: Any, server: FakeLLMServer, api: str, status: int, error: dict[str, Any]
) -> None:
    llm, sleeps = make_client(api)
    server.script(FakeReply(status=status, error=error))
    with pytest.raises(LLMAuthError, match="quota or spend limit"):
        await llm.chat(ask("x"))
    assert sleeps.calls == [] and len(server.requests) == 1


async def test_plain_rate_limit_linking_the_billing_page_is_still_retried(
    make_client: Any, server: FakeLLMServer
) -> None:
    llm, sleeps = make_client("openai")
    message = "Rate limit reached for gpt-4.1-mini on tokens per min. Add a payment method at https://platform.openai.com/account/billing."
    error = {"error": {"message": message, "type": "tokens", "code": "rate_limit_exceeded"}}
    server.script(FakeReply(status=429, error=error), FakeReply(text="ok"))
    assert (await llm.chat(ask("x"))).content == "ok" and len(sleeps.calls) == 1


async def test_failover_to_the_next_model(make_client: Any, server: FakeLLMServer) -> None:
    llm, _ = make_client("openai", max_retries=1, fallback_models=["claude-haiku-4-5"])
    server.script(FakeReply(status=503), FakeReply(status=429), FakeReply(text="from claude"))
    response = await llm.chat(ask("x"))
    assert response.content == "from claude"
    assert [r.api for r in server.requests] == ["openai", "openai", "anthropic"]
    assert llm.stats.failovers == 1 and "claude-haiku-4-5" in llm.stats.by_model


async def test_the_last_error_of_an_exhausted_chain_is_raised(
    make_client: Any, server: FakeLLMServer
) -> None:
    llm, _ = make_client("openai", max_retries=0, fallback_models=["gpt-4o-mini"])
    server.script(FakeReply(status=503), FakeReply(status=429))
    with pytest.raises(LLMRateLimited) as info:
        await llm.chat(ask("x"))
    assert info.value.model == "gpt-4o-mini"


@pytest.mark.parametrize("stream", [False, True])
async def test_an_exhausted_chain_raises_the_outage_not_the_fallbacks_refusal(
    make_client: Any, server: FakeLLMServer, stream: bool
) -> None:
    """An outage may pass; a refused fallback would not. The chain's error is the outage, so the turn
    waits for the model (bot/model_wait.py) instead of telling the chat the bot's access was refused."""
    llm, _ = make_client("openai", max_retries=0, fallback_models=["gpt-4o-mini"])
    server.script(FakeReply(status=503), FakeReply(status=401))
    with pytest.raises(LLMUnavailable) as info:
        await (collect(llm, ask("x")) if stream else llm.chat(ask("x")))
    assert info.value.model == "gpt-4.1-mini" and len(server.requests) == 2


async def test_a_named_model_does_not_fail_over(make_client: Any, server: FakeLLMServer) -> None:
    llm, _ = make_client("openai", max_retries=0, fallback_models=["claude-haiku-4-5"])
    server.script(FakeReply(status=503))
    with pytest.raises(LLMUnavailable):
        await llm.chat(ask("x", model="gpt-4o-mini"))
    assert [r.body["model"] for r in server.requests] == ["gpt-4o-mini"]


@pytest.mark.parametrize(
    ("api", "error"),
    [
        (
            "openai",
            {
                "error": {
                    "message": "This model's maximum context length is 128000 tokens.",
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                }
            },
        ),
        (
            "anthropic",
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 300000 tokens > 200000 maximum",
                },
            },
        ),
    ],
)
async def test_context_overflow_is_its_own_error(
    make_client: Any, server: FakeLLMServer, api: str, error: dict[str, Any]
) -> None:
    llm, sleeps = make_client(api, fallback_models=["gpt-4o-mini"])
    server.script(FakeReply(status=400, error=error))
    with pytest.raises(LLMContextOverflow, match="window"):
        await llm.chat(ask("x"))
    assert sleeps.calls == [] and len(server.requests) == 1


async def test_unknown_model_names_the_settings(make_client: Any, server: FakeLLMServer) -> None:
    llm, _ = make_client("openai")
    server.script(
        FakeReply(
            status=404, error={"error": {"message": "model not found", "type": "invalid_request_error"}}
        )
    )
    with pytest.raises(LLMBadResponse, match="MEMBOT_LLM__MODEL"):
        await llm.chat(ask("x"))


async def test_timeout_is_retried_then_reported(make_client: Any, server: FakeLLMServer) -> None:
    llm, sleeps = make_client("openai", max_retries=1)
    server.script(FakeReply(text="late", delay=30), FakeReply(text="late", delay=30))
    with pytest.raises(LLMTimeout, match=r"did not answer|timed out"):
        await llm.chat(ask("x", timeout=0.2))
    # Two tries, counted by the client: on a loaded machine the second may give up before the fake
    # has even read it, so the server's count is no measure.
    assert len(sleeps.calls) == 1 and llm.stats.failures == 2 and len(server.requests) >= 1


@both
async def test_malformed_json_is_a_bad_response(make_client: Any, server: FakeLLMServer, api: str) -> None:
    llm, sleeps = make_client(api)
    server.script(FakeReply(malformed=True))
    with pytest.raises(LLMBadResponse, match="malformed"):
        await llm.chat(ask("x"))
    assert sleeps.calls == []


async def test_unreachable_server_is_unavailable(http: httpx.AsyncClient, catalog: ModelCatalog) -> None:
    settings = LLMSettings.model_validate({"openai": {"base_url": "http://127.0.0.1:9/v1"}, "max_retries": 0})
    llm = LLMClient(settings, catalog, http)
    with pytest.raises(LLMUnavailable, match="cannot reach the OpenAI-compatible server"):
        await llm.chat(ask("x"))
    assert llm.stats.last_ok is False and llm.stats.last_error is not None
