"""split_message: limits, boundaries, and code fences that survive the split (hypothesis-checked)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.chunking import split_message, utf16_len

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def fence_lines(chunk: str) -> list[str]:
    return [line for line in chunk.split("\n") if FENCE.match(line)]


def content(text: str) -> str:
    """The text without fence lines and whitespace: what must survive a split unchanged."""
    return re.sub(r"\s+", "", "\n".join(line for line in text.split("\n") if not FENCE.match(line)))


def test_short_text_is_one_chunk_and_blank_is_none() -> None:
    assert split_message("hello", 100) == ["hello"]
    assert split_message("  \n ", 100) == []


def test_prefers_paragraphs_then_lines_then_words() -> None:
    text = "alpha beta gamma\n\ndelta epsilon"
    assert split_message(text, 20) == ["alpha beta gamma", "delta epsilon"]
    text = "line one here\nline two here"
    assert split_message(text, 20) == ["line one here", "line two here"]
    assert split_message("one two three four five six", 16) == ["one two three", "four five six"]
    assert split_message("x" * 40, 16) == ["x" * 16, "x" * 16, "x" * 8]


def test_a_paragraph_that_fits_its_own_chunk_is_not_cut() -> None:
    first = "a" * 30
    second = "b " * 20
    chunks = split_message(f"{first}\n\n{second.strip()}", 45)
    assert chunks == [first, second.strip()]


def test_code_block_is_closed_and_reopened_with_its_language() -> None:
    code = "\n".join(f"print({i})" for i in range(40))
    text = f"Intro.\n\n```python\n{code}\n```\n\nOutro."
    chunks = split_message(text, 120)
    assert len(chunks) > 2
    for chunk in chunks:
        assert len(chunk) <= 120
        assert len(fence_lines(chunk)) % 2 == 0, chunk
    assert all(c.startswith("```python\n") for c in chunks[1:-1])
    assert content("\n".join(chunks)) == content(text)


def test_tilde_and_long_fences_keep_their_marker() -> None:
    text = "~~~~sh\n" + "\n".join(f"echo {i}" for i in range(30)) + "\n~~~~"
    chunks = split_message(text, 60)
    for chunk in chunks:
        assert chunk.startswith("~~~~sh\n") and chunk.endswith("\n~~~~")


def test_utf16_measure_counts_emoji_as_two() -> None:
    assert utf16_len("a😀") == 3
    text = "😀" * 30
    chunks = split_message(text, 20, measure=utf16_len)
    assert [utf16_len(c) for c in chunks] == [20, 20, 20]
    assert "".join(chunks) == text


def test_a_long_code_line_is_cut_but_kept_whole_when_joined() -> None:
    line = "x = " + " + ".join(str(i) for i in range(200))
    chunks = split_message(f"```py\n{line}\n```", 100)
    assert all(len(c) <= 100 for c in chunks)
    inner = "".join(c.split("\n", 1)[1].rsplit("\n", 1)[0] for c in chunks)
    assert inner == line


def test_limit_too_small_is_refused() -> None:
    with pytest.raises(ValueError, match="too small"):
        split_message("hello world", 5)


_WORD = st.text(alphabet=st.sampled_from("abcdefghij😀é中 "), min_size=1, max_size=12)
_LINE = st.lists(_WORD, min_size=0, max_size=12).map(" ".join)


@st.composite
def markdown(draw: st.DrawFn) -> str:
    parts: list[str] = []
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            lang = draw(st.sampled_from(["", "python", "js"]))
            body = draw(st.lists(_LINE, max_size=15))
            parts.append("\n".join([f"```{lang}", *body, "```"]))
        else:
            parts.append("\n".join(draw(st.lists(_LINE, min_size=1, max_size=6))))
    return draw(st.sampled_from(["\n\n", "\n"])).join(parts)


@settings(max_examples=200, deadline=None)
@given(text=markdown(), limit=st.integers(min_value=30, max_value=200))
def test_properties_hold_for_random_markdown(text: str, limit: int) -> None:
    chunks = split_message(text, limit, measure=utf16_len)
    for chunk in chunks:
        assert utf16_len(chunk) <= limit
        assert chunk.strip()
        assert len(fence_lines(chunk)) % 2 == 0, chunk
    assert content("\n".join(chunks)) == content(text)


@pytest.mark.parametrize(
    "text",
    [
        "`" * 5000,  # a model repeating one token: a "fence" opening that is the whole answer
        "~" * 5000,
        "Here:\n\n```" + "a" * 5000 + "\nprint(1)\n```",  # an info string longer than a message
    ],
)
def test_a_fence_opening_too_long_to_repeat_is_split_as_plain_lines(text: str) -> None:
    for limit, measure in ((2000, len), (4096, utf16_len)):
        chunks = split_message(text, limit, measure=measure)
        assert chunks and all(measure(c) <= limit for c in chunks)
        assert re.sub(r"\s", "", "".join(chunks)) == re.sub(r"\s", "", text)


def test_a_closing_fence_longer_than_the_room_left_closes_with_the_fences_marker() -> None:
    code = "\n".join(f"print({i})" for i in range(300))
    for text in (f"```py\n{code}\n" + "`" * 5000, "```\nx = 1\n" + "`" * 5000, "```\n" + "`" * 5000):
        chunks = split_message(text, 2000)
        assert all(len(c) <= 2000 for c in chunks), [len(c) for c in chunks]
        assert all(len(fence_lines(c)) % 2 == 0 for c in chunks)
        assert content("\n".join(chunks)) == content(text)
