"""The SSE line parser shared by both streaming APIs."""

from __future__ import annotations

from collections.abc import AsyncIterator

from bot.llm.sse import SSEvent, iter_sse


async def lines(*items: str) -> AsyncIterator[str]:
    for item in items:
        yield item


async def parse(*items: str) -> list[SSEvent]:
    return [event async for event in iter_sse(lines(*items))]


async def test_named_and_unnamed_events() -> None:
    events = await parse(
        "event: message_start", 'data: {"a": 1}', "", 'data: {"b": 2}', "", "data: [DONE]", ""
    )
    assert events == [
        SSEvent("message_start", '{"a": 1}'),
        SSEvent("message", '{"b": 2}'),
        SSEvent("message", "[DONE]"),
    ]


async def test_comments_ids_and_crlf_are_ignored_and_multiline_data_joined() -> None:
    events = await parse(": keep-alive\r\n", "id: 7", "retry: 100", "data:first\r\n", "data: second", "\r\n")
    assert events == [SSEvent("message", "first\nsecond")]


async def test_a_last_event_without_blank_line_is_still_delivered() -> None:
    assert await parse("event: ping", "data: {}") == [SSEvent("ping", "{}")]


async def test_blank_lines_alone_make_no_events() -> None:
    assert await parse("", "", ": only a comment", "") == []
