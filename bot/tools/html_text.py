"""Readable text from HTML: what a model needs from a web page.

Parsed by lexbor (selectolax), an HTML5 parser in C that takes linear time on any input: the standard
library's parser is quadratic on unclosed tags, and one hostile 80 KB page (``"<a b" * 20000``) held
the event loop for 37 s (a 2 MB one, hours). The tree is walked with a stack, not recursion, so a page
nested a hundred thousand deep is just long.

Like every HTML5 parser lexbor is quadratic in nesting depth (200,000 nested ``<div>`` take it minutes),
so :func:`page_text` runs it on a thread of its own: lexbor releases the GIL, and the bot goes on.

selectolax is imported there, at the first page: a bot that never fetches one does not hold it (2.8 MiB).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selectolax.lexbor import LexborNode

_SKIP = frozenset({"script", "style", "noscript", "template", "svg", "head", "iframe", "object", "canvas"})
_BLOCK = frozenset(
    {
        "p", "div", "br", "tr", "section", "article", "header", "footer", "nav", "aside", "main",
        "ul", "ol", "table", "pre", "blockquote", "hr", "form", "figure", "figcaption", "dl", "dt", "dd",
    }
)  # fmt: skip
_HEADINGS = {f"h{n}": "\n\n" + "#" * n + " " for n in range(1, 7)}


def html_to_text(html: str) -> str:
    """The visible text of ``html``: scripts, styles and markup dropped, blocks on their own lines.

    The page title, when there is one, comes first as ``Title: ...``.
    """
    from selectolax.lexbor import LexborHTMLParser

    doc = LexborHTMLParser(html)
    found = doc.css_first("title")
    title = " ".join(found.text().split()) if found is not None else ""
    parts: list[str] = []
    start = doc.body or doc.root
    stack: list[tuple[LexborNode, bool]] = [(start, False)] if start is not None else []
    while stack:
        node, leaving = stack.pop()
        tag = node.tag or ""
        if leaving:
            parts.append("\n")
            continue
        if tag == "-text":
            parts.append(node.text_content or "")
            continue
        if tag in _SKIP or tag.startswith("-"):  # also comments ("-comment") and doctypes
            continue
        if tag in _BLOCK or tag in _HEADINGS:
            parts.append(_HEADINGS.get(tag, "\n"))
            stack.append((node, True))
        elif tag == "li":
            parts.append("\n- ")
        elif tag in ("td", "th"):
            parts.append(" | ")
        stack.extend((child, False) for child in reversed(list(node.iter(include_text=True))))
    lines = (re.sub(r"[ \t\r\f\v\xa0]+", " ", line).strip() for line in "".join(parts).split("\n"))
    body = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return f"Title: {title}\n\n{body}" if title else body


async def page_text(html: str) -> str:
    """:func:`html_to_text` on a daemon thread of its own, not the shared executor: a conversion its
    caller stopped waiting for (the tool's timeout) may run on for a while, and must neither hold a
    worker that file writes need nor delay the bot's exit."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str] = loop.create_future()

    def settle(text: str, error: Exception | None) -> None:
        if done.done():  # the caller gave up (cancelled)
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(text)

    def work() -> None:
        try:
            text, error = html_to_text(html), None
        except Exception as exc:  # lexbor refusing input: the caller's error, not this thread's death
            text, error = "", exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody is waiting
            loop.call_soon_threadsafe(settle, text, error)

    threading.Thread(target=work, name="html-text", daemon=True).start()
    return await done
