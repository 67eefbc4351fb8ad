"""The SSE line parser shared by both streaming APIs."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.llm.sse import SSETooLarge, SSEvent, iter_lines, iter_sse


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
    assert await parse("event: ping", "data: {}") == [SSEvent("ping", "{}", cut=True)]


async def test_blank_lines_alone_make_no_events() -> None:
    assert await parse("", "", ": only a comment", "") == []


async def split(*chunks: str, limit: int = 100) -> list[str]:
    return [line async for line in iter_lines(lines(*chunks), limit)]


async def test_lines_end_at_cr_lf_or_crlf_wherever_the_chunks_are_cut() -> None:
    assert await split("a\r", "\nb\rc", "\n\nd", "e\r\n", "\r", "f") == ["a", "b", "c", "", "de", "", "f"]
    assert await split("x\u2028y\x85z\x0c\n") == ["x\u2028y\x85z\x0c"]  # JSON may hold these raw


async def test_a_line_or_an_event_past_the_limit_is_too_large() -> None:
    assert await split("x" * 50, "x" * 50 + "\n") == ["x" * 100]
    with pytest.raises(SSETooLarge, match="a line over"):
        await split("x" * 50, "x" * 51)
    with pytest.raises(SSETooLarge, match="a line over"):
        await split("x" * 101 + "\n")
    assert [e async for e in iter_sse(lines("data: " + "x" * 49, "data: " + "x" * 50), limit=100)] == [
        SSEvent("message", "x" * 49 + "\n" + "x" * 50, cut=True)
    ]
    with pytest.raises(SSETooLarge, match="an event over"):
        [e async for e in iter_sse(lines(*["data:"] * 102), limit=100)]  # 101 newlines


@given(st.lists(st.text(alphabet="ab\r\n\u2028", min_size=1, max_size=8), max_size=12))
def test_lines_are_those_of_the_whole_text_however_it_is_cut(chunks: list[str]) -> None:
    whole = re.split(r"\r\n|\r|\n", "".join(chunks))
    if whole[-1] == "":  # the text ended with a line end: no line after it
        whole.pop()
    assert asyncio.run(split(*chunks, limit=1000)) == whole


def test_an_event_cut_inside_deeply_nested_data_counts_as_cut_short() -> None:
    """json.loads raises RecursionError, not ValueError, on data nested past its depth: such a cut event
    escaped the stream as a crash instead of an answer that did not come whole (retried)."""
    from bot.llm.streaming import _cut_short

    assert _cut_short(SSEvent("message", "[" * 100_000, cut=True))
    assert not _cut_short(SSEvent("message", '{"a": 1}', cut=True))
