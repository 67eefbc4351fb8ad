"""Readable text from HTML with the standard library's parser: what a model needs from a web page."""

from __future__ import annotations

import re
from html.parser import HTMLParser

_SKIP = frozenset({"script", "style", "noscript", "template", "svg", "head", "iframe", "object", "canvas"})
_BLOCK = frozenset(
    {
        "p", "div", "br", "tr", "section", "article", "header", "footer", "nav", "aside", "main",
        "ul", "ol", "table", "pre", "blockquote", "hr", "form", "figure", "figcaption", "dl", "dt", "dd",
    }
)  # fmt: skip


class _Extractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title = ""
        self._skip_depth = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if tag == "body":  # a missing </head> must not hide the whole page
            self._skip_depth = 0
        if tag in _SKIP:
            self._skip_depth += 1
            return
        if tag in _BLOCK:
            self.parts.append("\n")
        elif tag == "li":
            self.parts.append("\n- ")
        elif len(tag) == 2 and tag[0] == "h" and tag[1] in "123456":
            self.parts.append("\n\n" + "#" * int(tag[1]) + " ")
        elif tag in ("td", "th"):
            self.parts.append(" | ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in _SKIP:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif tag in _BLOCK or (len(tag) == 2 and tag[0] == "h" and tag[1] in "123456"):
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._skip_depth:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """The visible text of ``html``: scripts, styles and markup dropped, blocks on their own lines.

    The page title, when there is one, comes first as ``Title: ...``.
    """
    parser = _Extractor()
    parser.feed(html)
    parser.close()
    lines = (re.sub(r"[ \t\r\f\v\xa0]+", " ", line).strip() for line in "".join(parser.parts).split("\n"))
    body = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    title = " ".join(parser.title.split())
    return f"Title: {title}\n\n{body}" if title else body
