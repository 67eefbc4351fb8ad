"""Scrubbing lone surrogates: replaced, while a pair split into two code points is joined."""

from __future__ import annotations

from bot.domain import InboundMessage, ToolCall
from bot.llm.types import ChatResponse
from bot.surrogates import scrub, utf8


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
