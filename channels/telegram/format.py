"""Model Markdown → Telegram HTML, in chunks that each fit one Telegram message.

Telegram's HTML parse mode is the robust target for model output: only ``<``, ``>`` and ``&`` need
escaping, and the tag set is small (b, i, s, code, pre, a, blockquote, ...). Telegram has no headings,
lists or tables, so headings become bold lines, list items get "•"/"1." prefixes and a table becomes a
``<pre>`` block with its columns aligned (raw pipes in a proportional font are hard to read).

The reply is split *before* rendering (on the Markdown, with code fences closed and reopened by
:func:`~channels.chunking.split_message`) and each piece is rendered on its own, so every chunk's HTML
is balanced by construction and a split can never fall inside a tag or an entity. Rendering nearly
always shortens the visible text (markup characters disappear; a table's padding may add some), and
:func:`render_chunks` checks the rendered length and splits finer if a piece came out too long.

    for chunk in render_chunks(reply):
        await bot.send_message(chat_id, chunk.html, parse_mode="HTML")   # or chunk.plain as a fallback
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

from markdown_it import MarkdownIt
from markdown_it.token import Token

from channels.chunking import split_message, utf16_len
from channels.tables import layout

TELEGRAM_TEXT_LIMIT = 4096  # UTF-16 code units, counted after entity parsing
MIN_PIECE = 64  # the finest split render_chunks tries
_TAG = re.compile(r"<[^>]*>")
_LANGUAGE = re.compile(r"[A-Za-z0-9_+#.\-]{1,32}")
_SAFE_SCHEMES = ("http://", "https://", "tg://", "mailto:")


@dataclass(frozen=True, slots=True)
class RenderedChunk:
    """One message: ``html`` for parse_mode=HTML (``None`` if nothing renders), ``plain`` as fallback."""

    html: str | None
    plain: str


def visible_text(telegram_html: str) -> str:
    """The text Telegram shows (and counts) for an HTML message: tags removed, entities decoded."""
    return html.unescape(_TAG.sub("", telegram_html))


def render_chunks(markdown: str, limit: int = TELEGRAM_TEXT_LIMIT) -> list[RenderedChunk]:
    """Split ``markdown`` under ``limit`` UTF-16 units and render each piece to Telegram HTML."""
    chunks: list[RenderedChunk] = []
    if utf16_len(markdown) > limit:  # (one part: the renderer lays tables out the same way)
        markdown = _tables_as_code(markdown)
    for piece in split_message(markdown, limit, measure=utf16_len):
        rendered = markdown_to_html(piece)
        if not visible_text(rendered).strip():  # "[](url)", "> ": Telegram refuses a message showing nothing
            chunks.append(RenderedChunk(None, piece))
        elif utf16_len(visible_text(rendered)) <= limit:
            chunks.append(RenderedChunk(rendered, piece))
        elif limit > MIN_PIECE:  # a table's padding, rarely: split finer
            chunks.extend(render_chunks(piece, max(limit * 3 // 4, MIN_PIECE)))
        else:  # a piece that will not split further and still renders too long: as written
            chunks.append(RenderedChunk(None, piece))
    return chunks


def _tables_as_code(markdown: str) -> str:
    """``markdown`` with each top-level table already laid out, in a code block.

    The split cannot see a table: one longer than a message would reach the next part as rows without
    their header and rule line, which markdown-it no longer takes for a table (raw pipes). A code block
    is closed and reopened by the split, so every part shows its rows aligned, as one part would. A
    table inside a list or a quote is left to the renderer (its lines carry the list's or quote's marks).
    """
    tokens = _PARSER.parse(markdown)
    if not any(t.type == "table_open" and t.level == 0 for t in tokens):
        return markdown
    lines = markdown.split("\n")
    tables: list[tuple[int, int, str]] = []  # first line, line after, the laid-out table
    rows: list[list[str]] = []
    start = end = 0
    for token in tokens:
        if token.type == "table_open" and token.level == 0 and token.map is not None:
            (start, end), rows = token.map, []
        elif token.type == "tr_open":
            rows.append([])
        elif token.type == "inline" and rows and start < end:
            rows[-1].append(_plain(token.children or []))
        elif token.type == "table_close" and token.level == 0 and start < end:
            tables.append((start, end, layout(rows)))
            start = end = 0
    for first, after, laid_out in reversed(tables):
        longest = max((len(run) for run in re.findall("`+", laid_out)), default=0)
        fence = "`" * max(3, longest + 1)
        lines[first:after] = [fence, *laid_out.split("\n"), fence]
    return "\n".join(lines)


def markdown_to_html(markdown: str) -> str:
    """Render CommonMark (plus ~~strike~~) as Telegram-flavoured HTML; raw HTML is shown as text."""
    return _Renderer().render(_PARSER.parse(markdown)).strip()


_PARSER = MarkdownIt("commonmark", {"html": True, "linkify": False}).enable(["strikethrough", "table"])

_INLINE_TAGS = {
    "strong_open": "<b>",
    "strong_close": "</b>",
    "em_open": "<i>",
    "em_close": "</i>",
    "s_open": "<s>",
    "s_close": "</s>",
}


class _Renderer:
    """Walks markdown-it's token stream once, keeping track of lists and quotes."""

    def __init__(self) -> None:
        self._out = ""
        self._lists: list[str] = []  # "•" for bullet lists, "ol" for ordered ones
        self._quotes = 0
        self._fresh = True  # just opened a list item or a quote: the next block needs no gap
        self._links: list[bool] = []  # whether each open link was rendered as <a>
        self._table: list[list[str]] | None = None  # the rows of the table being read

    def render(self, tokens: Sequence[Token]) -> str:
        for token in tokens:
            self._block(token)
        return self._out

    # -- blocks -------------------------------------------------------------------------------------

    def _gap(self, newlines: int) -> None:
        """Separate the next block from what came before with ``newlines`` line breaks."""
        if self._fresh or not self._out:
            self._fresh = False
            return
        have = len(self._out) - len(self._out.rstrip("\n"))
        self._out += "\n" * max(0, newlines - have)

    def _block(self, token: Token) -> None:
        kind = token.type
        if self._table is not None or kind == "table_open":
            self._table_token(token)
        elif kind == "paragraph_open" and not token.hidden:
            self._gap(2)
        elif kind == "heading_open":
            self._gap(2)
            self._out += "<b>"
        elif kind == "heading_close":
            self._out += "</b>"
        elif kind in ("bullet_list_open", "ordered_list_open"):
            self._gap(1 if self._lists else 2)
            self._lists.append("•" if kind == "bullet_list_open" else "ol")
        elif kind in ("bullet_list_close", "ordered_list_close"):
            self._lists.pop()
        elif kind == "list_item_open":
            self._gap(1)
            marker = self._lists[-1] if self._lists else "•"
            bullet = "•" if marker == "•" else f"{token.info or '1'}."
            self._out += "   " * (len(self._lists) - 1) + bullet + " "
            self._fresh = True
        elif kind == "blockquote_open":
            self._gap(2)
            if self._quotes == 0:  # Telegram does not nest quotes
                self._out += "<blockquote>"
            self._quotes += 1
            self._fresh = True
        elif kind == "blockquote_close":
            self._quotes -= 1
            if self._quotes == 0:
                self._out = self._out.rstrip("\n") + "</blockquote>"
            self._fresh = False
        elif kind in ("fence", "code_block"):
            self._gap(2)
            self._out += _code_block(token.content, token.info)
        elif kind == "hr":
            self._gap(2)
            self._out += "———"
        elif kind == "html_block":
            self._gap(2)
            self._out += html.escape(token.content.rstrip("\n"), quote=False)
        elif kind == "inline":
            self._fresh = False
            self._inline(token.children or [])

    def _table_token(self, token: Token) -> None:
        """Collect a table's cells as plain text; at its end, lay it out in a ``<pre>`` block."""
        kind = token.type
        if kind == "table_open":
            self._table = []
        elif kind == "tr_open" and self._table is not None:
            self._table.append([])
        elif kind == "inline" and self._table:
            self._table[-1].append(_plain(token.children or []))
        elif kind == "table_close" and self._table is not None:
            rows, self._table = self._table, None
            self._gap(2)
            self._out += f"<pre>{html.escape(layout(rows), quote=False) or ' '}</pre>"

    # -- inline -------------------------------------------------------------------------------------

    def _inline(self, tokens: Sequence[Token]) -> None:
        for token in tokens:
            kind = token.type
            if kind in _INLINE_TAGS:
                self._out += _INLINE_TAGS[kind]
            elif kind == "text":
                self._out += html.escape(token.content, quote=False)
            elif kind == "code_inline":
                self._out += f"<code>{html.escape(token.content, quote=False)}</code>"
            elif kind in ("softbreak", "hardbreak"):
                self._out += "\n"
            elif kind == "link_open":
                href = str(token.attrs.get("href", ""))
                safe = href.startswith(_SAFE_SCHEMES)
                self._links.append(safe)
                if safe:
                    self._out += f'<a href="{html.escape(href, quote=True)}">'
            elif kind == "link_close":
                if self._links.pop():
                    self._out += "</a>"
            elif kind == "image":
                self._image(token)
            elif kind == "html_inline":
                self._out += html.escape(token.content, quote=False)

    def _image(self, token: Token) -> None:
        src = str(token.attrs.get("src", ""))
        alt = html.escape(token.content or "image", quote=False)
        if src.startswith(_SAFE_SCHEMES):
            self._out += f'<a href="{html.escape(src, quote=True)}">{alt}</a>'
        else:
            self._out += alt


def _plain(tokens: Sequence[Token]) -> str:
    """An inline's text without its markup (a table cell shown in a ``<pre>`` block)."""
    return "".join(" " if t.type in ("softbreak", "hardbreak") else t.content for t in tokens)


def _code_block(content: str, info: str) -> str:
    body = html.escape(content.rstrip("\n"), quote=False) or " "
    language = info.split()[0] if info.strip() else ""
    if language and _LANGUAGE.fullmatch(language):
        return f'<pre><code class="language-{language}">{body}</code></pre>'
    return f"<pre>{body}</pre>"
