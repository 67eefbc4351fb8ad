"""The pure translators (openai.py, anthropic.py) and tool-pair repair, without any network."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from bot.catalog import ModelCatalog
from bot.domain import ImagePart, Message, Role, ToolCall
from bot.errors import LLMBadResponse, LLMError, LLMRateLimited, LLMUnavailable
from bot.llm import ChatRequest, ToolSpec, anthropic, openai
from bot.llm.sse import SSEvent
from bot.llm.tool_pairs import MISSING_RESULT, paired
from bot.llm.turns import OPENING, normalized
from bot.llm.types import Wire
from bot.llm.wire_ids import OPENAI_IDS

TIMEOUT = httpx.Timeout(5.0)
TOOL = ToolSpec("files", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}})
CALLS = (ToolCall("t1", "files", '{"path": "a"}'), ToolCall("t2", "files", "{bad json"))
HISTORY = (
    Message(Role.SYSTEM, "[summary] earlier"),
    Message(Role.USER, "read a and b"),
    Message(Role.ASSISTANT, "", tool_calls=CALLS),
    Message(Role.TOOL, "A", tool_call_id="t1", name="files"),
    Message(Role.TOOL, "", tool_call_id="t2", name="files"),
    Message(Role.USER, "thanks", images=(ImagePart("image/jpeg", "/9j/"),)),
)


def body(request: httpx.Request) -> dict[str, Any]:
    return json.loads(request.content)


def build(module: Any, catalog: ModelCatalog, model: str, **kw: Any) -> httpx.Request:
    args: dict[str, Any] = {
        "model": catalog.get(model),
        "base_url": None,
        "api_key": "k",
        "max_tokens": 50,
        "temperature": 0.2,
        "timeout": TIMEOUT,
    }
    args.update(kw)
    request = ChatRequest(messages=HISTORY, system="base", tools=(TOOL,))
    return module.build_request(request, Wire(**args))


# ---- OpenAI ---------------------------------------------------------------------------------------


def test_openai_request(catalog: ModelCatalog) -> None:
    request = build(openai, catalog, "gpt-4.1-mini", stream=True)
    assert str(request.url) == "https://api.openai.com/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer k"
    data = body(request)
    assert data["max_completion_tokens"] == 50 and data["temperature"] == 0.2
    assert data["stream"] is True and data["stream_options"] == {"include_usage": True}
    assert data["tools"][0]["function"]["name"] == "files"
    roles = [m["role"] for m in data["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user"]
    assert data["messages"][0]["content"] == "base\n\n[summary] earlier"
    assistant = data["messages"][2]
    assert assistant["content"] is None
    # Broken arguments go back as an empty object: local servers refuse the whole request otherwise.
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == ['{"path": "a"}', "{}"]
    assert data["messages"][4] == {"role": "tool", "tool_call_id": "t2", "content": ""}
    assert data["messages"][5]["content"] == [
        {"type": "text", "text": "thanks"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/"}},
    ]
    assert request.extensions["timeout"]["read"] == 5.0


def test_openai_local_server_gets_max_tokens_and_no_auth(catalog: ModelCatalog) -> None:
    request = build(openai, catalog, "llama3.1", base_url="http://localhost:11434/v1/", api_key=None)
    assert str(request.url) == "http://localhost:11434/v1/chat/completions"
    assert "authorization" not in request.headers
    assert body(request)["max_tokens"] == 50


def test_openai_omits_temperature_when_the_model_has_none(catalog: ModelCatalog) -> None:
    data = body(build(openai, catalog, "gpt-5"))
    assert "temperature" not in data and data["max_completion_tokens"] == 50


def test_openai_drops_empty_assistant_turns() -> None:
    request = ChatRequest(
        messages=(Message(Role.USER, "a"), Message(Role.ASSISTANT, ""), Message(Role.USER, "b"))
    )
    assert openai.messages(request) == [{"role": "user", "content": "a\n\nb"}]


def test_openai_parse_response_with_tool_calls_and_cached_usage() -> None:
    response = openai.parse_response(
        {
            "model": "gpt-4.1-mini-2025-04-14",
            "choices": [
                {
                    "message": {
                        "content": None,
                        "tool_calls": [
                            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 64},
            },
        },
        "gpt-4.1-mini",
    )
    assert response.content == "" and response.tool_calls == (ToolCall("c1", "f", "{}"),)
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.cached_tokens) == (
        100,
        7,
        64,
    )
    assert response.model == "gpt-4.1-mini-2025-04-14" and response.stop_reason == "tool_calls"


def test_openai_refusal_and_missing_ids() -> None:
    refusal = openai.parse_response({"choices": [{"message": {"content": None, "refusal": "I can't."}}]}, "m")
    assert refusal.content == "I can't."
    local = {"choices": [{"message": {"tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}}]}
    assert openai.parse_response(local, "m").tool_calls[0].id == ""  # the client names it (call_ids.py)


@pytest.mark.parametrize("bad", [{}, {"choices": [{}]}, [], "text", None])
def test_openai_unexpected_bodies_are_bad_responses(bad: Any) -> None:
    with pytest.raises(LLMBadResponse):
        openai.parse_response(bad, "m")


def test_an_openai_answer_with_no_choice_is_an_outage_or_its_error() -> None:
    with pytest.raises(LLMUnavailable, match="no choice"):
        openai.parse_response({"choices": [], "usage": {"prompt_tokens": 9}}, "m")
    with pytest.raises(LLMRateLimited):  # OpenRouter's error object sent with it says what it was
        openai.parse_response({"choices": [], "error": {"code": 429, "message": "slow down"}}, "m")


def sse(data: Any, event: str = "message") -> SSEvent:
    return SSEvent(event, data if isinstance(data, str) else json.dumps(data))


def test_openai_stream_decoder_joins_tool_fragments_by_index() -> None:
    decoder = openai.StreamDecoder("m")
    chunks = [
        {"choices": [{"delta": {"role": "assistant", "content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo"}}]},
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": ""}}]
                    }
                }
            ]
        },
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x"'}}
                        ]
                    }
                }
            ]
        },
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}},
    ]
    events = [e for chunk in chunks for e in decoder.feed(sse(chunk))]
    assert [(e.kind, e.text) for e in events] == [
        ("text", "Hel"),
        ("text", "lo"),
        ("tool_call", "g"),
        ("tool_call", "f"),
    ]
    assert decoder.complete and not decoder.done
    decoder.feed(sse("[DONE]"))
    final = decoder.finish()
    assert decoder.done and final.content == "Hello"
    assert final.tool_calls == (ToolCall("a", "f", '{"x": 1}'), ToolCall("b", "g", "{}"))
    assert (final.usage.input_tokens, final.usage.output_tokens) == (9, 4)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_arguments_in_many_small_fragments_are_joined_in_order(api: str) -> None:
    """Fragments go into one buffer per call (added to one string, each copied all before it: 8 MiB in
    32,768 fragments took 34.5 s, now 0.11 s; measured, not asserted here: a timed test is noise)."""
    decoder: openai.StreamDecoder | anthropic.StreamDecoder
    if api == "openai":
        decoder = openai.StreamDecoder("m")
        call = {"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}
        decoder.feed(sse({"choices": [{"delta": {"tool_calls": [call]}}]}))
        fragment = {
            "choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "x" * 128}}]}}]
        }
        event = sse(fragment)
    else:
        decoder = anthropic.StreamDecoder("m")
        block = {"type": "tool_use", "id": "c", "name": "f", "input": {}}
        decoder.feed(
            sse({"type": "content_block_start", "index": 0, "content_block": block}, "content_block_start")
        )
        delta = {"type": "input_json_delta", "partial_json": "x" * 128}
        event = sse({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta")
    for _ in range(4096):
        decoder.feed(event)
    [call] = decoder.finish().tool_calls
    assert call.arguments == "x" * 128 * 4096


def test_openai_parallel_calls_all_at_one_index_stay_apart() -> None:
    """Gemini's OpenAI-compatible stream sends each whole call at index 0 (or none): merged into one,
    all but one were lost and the last had three objects for arguments."""
    decoder = openai.StreamDecoder("m")
    for n, city in enumerate(["Paris", "London", "Rome"]):
        call = {"id": f"c{n}", "function": {"name": "weather", "arguments": json.dumps({"city": city})}}
        if n != 1:
            call["index"] = 0
        decoder.feed(sse({"choices": [{"delta": {"tool_calls": [call]}}]}))
    decoder.feed(sse({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}))
    assert [(c.id, json.loads(c.arguments)["city"]) for c in decoder.finish().tool_calls] == [
        ("c0", "Paris"),
        ("c1", "London"),
        ("c2", "Rome"),
    ]


def test_openai_content_in_parts_shows_the_text_and_not_the_reasoning() -> None:
    parts = [
        {"type": "thinking", "thinking": [{"type": "text", "text": "private"}]},
        {"type": "text", "text": "Paris"},
    ]
    assert openai.parse_response({"choices": [{"message": {"content": parts}}]}, "m").content == "Paris"
    decoder = openai.StreamDecoder("m")
    decoder.feed(sse({"choices": [{"delta": {"content": parts}}]}))
    with capture_logs() as logs:
        decoder.feed(
            sse({"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": "n/a"}})
        )
        final = decoder.finish()
        whole = openai.parse_response(
            {"choices": [{"message": {"content": "Paris"}}], "usage": {"completion_tokens": 4.5}}, "m"
        )
    assert final.content == "Paris" and final.usage.input_tokens == 0  # a usage that is no number: 0
    assert whole.content == "Paris" and whole.usage.output_tokens == 0
    warned = [(e["field"], e["value_type"]) for e in logs if e["event"] == "llm_usage_malformed"]
    assert warned == [("prompt_tokens", "str"), ("completion_tokens", "float")]


def test_openai_stream_error_chunk_is_classified() -> None:
    decoder = openai.StreamDecoder("m")
    with pytest.raises(LLMUnavailable, match="mid-answer"):
        decoder.feed(sse({"error": {"type": "server_error", "message": "boom"}}))
    with pytest.raises(LLMBadResponse, match="malformed"):
        decoder.feed(sse("{not json"))


# ---- Anthropic ------------------------------------------------------------------------------------


def test_anthropic_request(catalog: ModelCatalog) -> None:
    request = build(anthropic, catalog, "claude-haiku-4-5", temperature=1.7, stream=True)
    assert str(request.url) == "https://api.anthropic.com/v1/messages"
    assert request.headers["x-api-key"] == "k" and request.headers["anthropic-version"] == "2023-06-01"
    data = body(request)
    assert data["system"] == "base\n\n[summary] earlier"
    assert data["max_tokens"] == 50 and data["temperature"] == 1.0 and data["stream"] is True
    assert data["tools"] == [{"name": "files", "description": "Read a file", "input_schema": TOOL.parameters}]
    turns = data["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    uses = turns[1]["content"]
    assert [(b["type"], b["id"], b["input"]) for b in uses] == [
        ("tool_use", "t1", {"path": "a"}),
        ("tool_use", "t2", {}),
    ]
    results = turns[2]["content"]
    assert [b["type"] for b in results] == ["tool_result", "tool_result", "image", "text"]
    assert [b.get("tool_use_id") for b in results[:2]] == ["t1", "t2"]
    assert results[1]["content"] == "(empty)"


def test_anthropic_history_must_open_with_the_user() -> None:
    system, turns = anthropic.messages(ChatRequest(messages=(Message(Role.ASSISTANT, "hello"),)))
    assert system == "" and [t["role"] for t in turns] == ["user", "assistant"]
    _, empty = anthropic.messages(ChatRequest(messages=()))
    assert [t["role"] for t in empty] == ["user"]


def test_anthropic_parse_response_counts_cache_reads_as_input() -> None:
    response = anthropic.parse_response(
        {
            "content": [
                {"type": "thinking", "thinking": "..."},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "tu1", "name": "files", "input": {"path": "a"}},
            ],
            "model": "claude-haiku-4-5-20251001",
            "stop_reason": "tool_use",
            "usage": {
                "input_tokens": 10,
                "cache_read_input_tokens": 90,
                "cache_creation_input_tokens": 5,
                "output_tokens": 3,
            },
        },
        "claude-haiku-4-5",
    )
    assert response.content == "Let me look."
    assert response.tool_calls == (ToolCall("tu1", "files", '{"path": "a"}'),)
    assert (response.usage.input_tokens, response.usage.cached_tokens, response.usage.output_tokens) == (
        105,
        90,
        3,
    )


@pytest.mark.parametrize("bad", [{}, {"content": None}, {"content": [{"type": "tool_use"}]}, [], None])
def test_anthropic_unexpected_bodies_are_bad_responses(bad: Any) -> None:
    with pytest.raises(LLMBadResponse):
        anthropic.parse_response(bad, "m")


def test_anthropic_stream_decoder() -> None:
    decoder = anthropic.StreamDecoder("m")
    stream = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {"model": "claude-x", "usage": {"input_tokens": 12, "output_tokens": 1}},
            },
        ),
        ("ping", {"type": "ping"}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi "}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "there"}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "tu", "name": "files", "input": {}},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"pa'},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": 'th": "a"}'},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 20}},
        ),
    ]
    events = [e for name, data in stream for e in decoder.feed(sse(data, name))]
    assert [(e.kind, e.text) for e in events] == [("text", "Hi "), ("text", "there"), ("tool_call", "files")]
    assert decoder.complete and not decoder.done  # whole by its stop reason (message_stop may be lost)
    decoder.feed(sse({"type": "message_stop"}, "message_stop"))
    final = decoder.finish()
    assert decoder.done and final.content == "Hi there" and final.model == "claude-x"
    assert final.tool_calls == (ToolCall("tu", "files", '{"path": "a"}'),) and final.stop_reason == "tool_use"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (12, 20)


def test_anthropic_compatible_servers_input_in_the_block_start_and_usage_at_the_end() -> None:
    """Whole tool input in content_block_start (no deltas) was read as {}; input tokens counted only in
    message_delta were read as 0; an error event that is a bare string raised AttributeError."""
    decoder = anthropic.StreamDecoder("m")
    stream = [
        ("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 0}}}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": "tu", "name": "files", "input": {"path": "a"}},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use"},
                "usage": {"input_tokens": 30, "output_tokens": 5},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    for name, data in stream:
        decoder.feed(sse(data, name))
    final = decoder.finish()
    assert final.tool_calls == (ToolCall("tu", "files", '{"path": "a"}'),)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (30, 5)
    with pytest.raises(LLMError, match="overloaded"):
        anthropic.StreamDecoder("m").feed(sse({"type": "error", "error": "overloaded"}, "error"))


def test_anthropic_stream_without_message_stop_is_complete_only_after_a_stop_reason_with_blocks_closed() -> (
    None
):
    opened = [
        ("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 3}}}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
        ),
    ]
    stop = ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}})
    no_reason = ("message_delta", {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 2}})
    closed = ("content_block_stop", {"type": "content_block_stop", "index": 0})

    def fed(*events: tuple[str, dict[str, Any]]) -> anthropic.StreamDecoder:
        decoder = anthropic.StreamDecoder("m")
        for name, data in events:
            decoder.feed(sse(data, name))
        return decoder

    assert not fed(*opened).complete
    assert not fed(*opened, stop).complete  # a block still open: the delta may be a server's mistake
    assert not fed(*opened, closed).complete
    assert not fed(*opened, closed, no_reason).complete
    whole = fed(*opened, closed, stop)
    assert whole.complete and not whole.done
    assert whole.finish().content == "hi"


def test_anthropic_usage_that_is_no_count_keeps_the_answer_and_is_logged() -> None:
    """int("n/a") in a usage count raised ValueError: the whole answer was thrown away (and asked again
    at the fallback), for a count. Now the count is 0 and logged; null stays 0 without a word."""
    usage = {"input_tokens": "n/a", "output_tokens": 2.5, "cache_read_input_tokens": None}
    body = {"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "usage": usage}
    with capture_logs() as logs:
        whole = anthropic.parse_response(body, "m")
        decoder = anthropic.StreamDecoder("m")
        for name, data in [
            ("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": [7]}}}),
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            ),
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": "9"},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]:
            decoder.feed(sse(data, name))
        streamed = decoder.finish()
    assert whole.content == streamed.content == "ok"
    assert (whole.usage.input_tokens, whole.usage.output_tokens, whole.usage.calls) == (0, 0, 1)
    assert (streamed.usage.input_tokens, streamed.usage.output_tokens) == (0, 0)
    warned = [(e["field"], e["value_type"]) for e in logs if e["event"] == "llm_usage_malformed"]
    assert warned == [
        ("input_tokens", "str"),
        ("output_tokens", "float"),
        ("input_tokens", "list"),
        ("output_tokens", "str"),
    ]


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("overloaded_error", LLMUnavailable),
        ("api_error", LLMUnavailable),
        ("rate_limit_error", LLMRateLimited),
        ("invalid_request_error", LLMBadResponse),
    ],
)
def test_anthropic_error_event_is_classified_like_the_response(kind: str, error: type[Exception]) -> None:
    decoder = anthropic.StreamDecoder("m")
    with pytest.raises(error, match="mid-answer"):
        decoder.feed(sse({"type": "error", "error": {"type": kind, "message": "x"}}, "error"))


# ---- tool pairs -----------------------------------------------------------------------------------


def test_paired_leaves_a_sound_history_alone() -> None:
    assert paired(HISTORY) == list(HISTORY)


def test_paired_answers_interrupted_calls_and_keeps_orphan_results_as_text() -> None:
    history = [
        Message(Role.TOOL, "stale", tool_call_id="old", name="web_fetch"),
        Message(Role.USER, "go"),
        Message(Role.ASSISTANT, "", tool_calls=CALLS),
        Message(Role.TOOL, "B", tool_call_id="t2"),
        Message(Role.TOOL, "B again", tool_call_id="t2"),
        Message(Role.USER, "and?"),
        Message(Role.ASSISTANT, "", tool_calls=(ToolCall("t3", "files", "{}"),)),
    ]
    out = paired(history)
    assert [(m.role.value, m.tool_call_id) for m in out] == [
        ("user", None),
        ("user", None),
        ("assistant", None),
        ("tool", "t2"),
        ("tool", "t1"),
        ("user", None),
        ("user", None),
        ("assistant", None),
        ("tool", "t3"),
    ]
    assert out[0].content == "[earlier result of web_fetch]\nstale"
    assert out[4].content == MISSING_RESULT and out[8].content == MISSING_RESULT
    assert out[5].content.endswith("B again") and out[6].content == "and?"


# ---- one system prompt, alternating turns (strict chat templates) ----------------------------------


def test_history_is_normalized_for_strict_templates_and_tool_pairs_are_kept() -> None:
    calls = (ToolCall("c1", "files", "{}"),)
    history = (
        Message(Role.ASSISTANT, "welcome back"),  # the history starts with the model after compaction
        Message(Role.SYSTEM, "[summary] likes tea"),
        Message(Role.USER, "first question"),  # stopped before it was answered
        Message(Role.USER, "second", images=(ImagePart("image/png", "AAAA"),)),
        Message(Role.ASSISTANT, "let me look"),
        Message(Role.ASSISTANT, "", tool_calls=calls),
        Message(Role.TOOL, "r1", tool_call_id="c1", name="files"),
        Message(Role.ASSISTANT, ""),
        Message(Role.USER, "third"),
    )
    system, out = normalized(ChatRequest(messages=history, system="base"), OPENAI_IDS)
    assert system == "base\n\n[summary] likes tea"
    assert [(m.role, m.content) for m in out] == [
        (Role.USER, OPENING),
        (Role.ASSISTANT, "welcome back"),
        (Role.USER, "first question\n\nsecond"),
        (Role.ASSISTANT, "let me look"),
        (Role.TOOL, "r1"),
        (Role.USER, "third"),
    ]
    assert out[2].images == (ImagePart("image/png", "AAAA"),)
    assert out[3].tool_calls == calls  # the text and the call it led to are one assistant turn


@pytest.mark.parametrize(
    ("name", "sent"),
    [
        ("", "unnamed_tool"),
        ("files<|channel|>commentary", "files_channel_commentary"),  # a local model's leaked template
        ("web.fetch", "web_fetch"),
        ("x" * 80, "x" * 64),
        ("files", "files"),
    ],
)
def test_tool_call_names_go_out_as_both_apis_accept_them(name: str, sent: str) -> None:
    """Both APIs take tool names of ``[a-zA-Z0-9_-]{1,64}`` only: a call the model named otherwise (its
    result said there is no such tool) made every later request of the chat fail."""
    call = ToolCall("call_1", name, "{}")
    history = [
        Message(Role.USER, "hi"),
        Message(Role.ASSISTANT, "", tool_calls=(call,)),
        Message(Role.TOOL, "Error: there is no tool named that.", tool_call_id="call_1"),
    ]
    _, out = normalized(ChatRequest(messages=history), OPENAI_IDS)
    assert [c.name for c in out[1].tool_calls] == [sent]
    assert history[1].tool_calls[0].name == name  # the session keeps what the model wrote
