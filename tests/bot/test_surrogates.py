"""Scrubbing lone surrogates: replaced, while a pair split into two code points is joined."""

from __future__ import annotations

import json

from bot.domain import InboundMessage, ToolCall
from bot.llm.types import ChatResponse
from bot.surrogates import scrub, scrub_json_text, utf8


def test_scrub_replaces_lone_surrogates_and_joins_pairs() -> None:
    clean = "plain text ✓"
    assert scrub(clean) is clean
    assert scrub("a\ud800b\udfff") == "a\ufffdb\ufffd"
    assert scrub("\ud83d\ude00") == "😀"
    assert utf8("x\udc80") == "x\ufffd".encode()


def test_inbound_messages_and_model_answers_are_scrubbed_when_built() -> None:
    inbound = InboundMessage("telegram", "1", "2", "hi \ud800", sender_name="\udfffAl")
    assert (inbound.text, inbound.sender_name) == ("hi \ufffd", "\ufffdAl")
    answer = ChatResponse("ok \ud800", (ToolCall("c\ud800", "files", '{"p": "\udc00"}'),))
    assert answer.content == "ok \ufffd"
    assert answer.tool_calls == (ToolCall("c\ufffd", "files", '{"p": "\ufffd"}'),)


def test_tool_arguments_are_scrubbed_as_decoded_json_too() -> None:
    """An escaped lone surrogate is ASCII in the text and a lone surrogate once decoded."""
    escaped = ChatResponse("", (ToolCall("c1", "memory", '{"content": "Zo\\ud83d", "n": [1, "\\udc00"]}'),))
    assert json.loads(escaped.tool_calls[0].arguments) == {"content": "Zo\ufffd", "n": [1, "\ufffd"]}
    for kept in ('{"content": "smile \\ud83d\\ude00"}', '{"broken": "\\ud83d', "not json"):
        assert (
            scrub_json_text(kept) == kept
        )  # a well-formed pair; text that is no JSON is left to the tool loop
