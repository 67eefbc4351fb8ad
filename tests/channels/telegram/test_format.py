"""Markdown → Telegram HTML, checked against the fake server's validator (Telegram's rules)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.telegram.format import markdown_to_html, render_chunks, visible_text
from tests.fakes.telegram_server import TelegramAPIError, parse_html, utf16_len


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("**bold** and *it* and ~~gone~~", "<b>bold</b> and <i>it</i> and <s>gone</s>"),
        ("`a < b && c`", "<code>a &lt; b &amp;&amp; c</code>"),
        ("# Title\n\ntext", "<b>Title</b>\n\ntext"),
        ("- one\n- two\n  - deeper", "• one\n• two\n   • deeper"),
        ("3. three\n4. four", "3. three\n4. four"),
        ("> quoted **words**\n> more", "<blockquote>quoted <b>words</b>\nmore</blockquote>"),
        (
            "```python\nif a < b:\n    pass\n```",
            '<pre><code class="language-python">if a &lt; b:\n    pass</code></pre>',
        ),
        ("```\nplain\n```", "<pre>plain</pre>"),
        ("[site](https://example.com/?a=1&b=2)", '<a href="https://example.com/?a=1&amp;b=2">site</a>'),
        ("[bad](javascript:alert(1))", "[bad](javascript:alert(1))"),
        ("<script>x</script> & <b>", "&lt;script&gt;x&lt;/script&gt; &amp; &lt;b&gt;"),
        ("![a cat](https://example.com/cat.png)", '<a href="https://example.com/cat.png">a cat</a>'),
        ("> > nested", "<blockquote>nested</blockquote>"),
        (  # a table: aligned in monospace (raw pipes in a proportional font were hard to read)
            "| Item | Price |\n|---|---:|\n| **Tea** | 3 |\n| Coffee & cake | 4.50 |",
            "<pre>Item          | Price\n--------------+------\nTea           | 3\nCoffee &amp; cake | 4.50</pre>",
        ),
    ],
)
def test_rendering(markdown: str, expected: str) -> None:
    rendered = markdown_to_html(markdown)
    assert rendered == expected
    parse_html(rendered)  # Telegram would accept it


def test_the_fake_rejects_what_telegram_rejects() -> None:
    for bad in (
        "<b>open",
        "a < b",
        "x & y",
        "<h1>t</h1>",
        "<b><i>x</b></i>",
        "&nbsp;",
        "<pre><b>x</b></pre>",
    ):
        with pytest.raises(TelegramAPIError, match="can't parse entities"):
            parse_html(bad)
    assert parse_html('<a href="https://x.y">l</a> &lt;&amp;&gt; &#128512;') == "l <&> 😀"


def test_long_code_block_chunks_each_render_valid_html() -> None:
    code = "\n".join(f"x{i} = '<{i}>' & 1  # 😀" for i in range(400))
    chunks = render_chunks(f"Intro\n\n```js\n{code}\n```\n\nOutro", limit=1000)
    assert len(chunks) > 5
    for chunk in chunks:
        assert chunk.html is not None
        assert utf16_len(parse_html(chunk.html)) <= 1000
        assert utf16_len(chunk.plain) <= 1000
    assert all('<code class="language-js">' in c.html for c in chunks[1:-1] if c.html)


_WORD = st.sampled_from(
    ["plain", "**bold**", "*it*", "`co<de>`", "a&b", "<tag>", "😀", "[l](https://x.y)", "~~s~~"]
)
_LINE = st.lists(_WORD, min_size=1, max_size=10).map(" ".join)
_BLOCK = st.one_of(
    _LINE,
    st.lists(_LINE, min_size=1, max_size=5).map(lambda lines: "\n".join(f"- {line}" for line in lines)),
    st.lists(_LINE, min_size=1, max_size=5).map(lambda lines: "\n".join(f"> {line}" for line in lines)),
    st.lists(_LINE, min_size=0, max_size=30).map(lambda lines: "```py\n" + "\n".join(lines) + "\n```"),
    st.lists(_LINE, min_size=1, max_size=8).map(
        lambda lines: "| a | b |\n|---|---|\n" + "\n".join(f"| {line} | x |" for line in lines)
    ),
)


@settings(max_examples=150, deadline=None)
@given(blocks=st.lists(_BLOCK, min_size=1, max_size=12), limit=st.integers(min_value=80, max_value=600))
def test_every_chunk_is_valid_telegram_html_under_the_limit(blocks: list[str], limit: int) -> None:
    for chunk in render_chunks("\n\n".join(blocks), limit=limit):
        if chunk.html is not None:
            shown = parse_html(chunk.html)
            assert shown == visible_text(chunk.html)
            assert utf16_len(shown) <= limit
        assert utf16_len(chunk.plain) <= limit


@pytest.fixture(autouse=True)
def _quiet_markdown_it() -> Iterator[None]:
    """markdown-it logs every block rule at DEBUG; the suite logs at DEBUG, which makes this slow."""
    logger = logging.getLogger("markdown_it")
    level = logger.level
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(level)
