"""Readable text from HTML: what a model needs from a web page.

Parsed by lexbor (selectolax), an HTML5 parser in C that takes linear time on unclosed tags: the standard
library's parser is quadratic on them, and one hostile 80 KB page (``"<a b" * 20000``) held the event loop
for 37 s (a 2 MB one, hours). The tree is walked with a stack, not recursion, so a page nested a hundred
thousand deep is just long.

Like every HTML5 parser lexbor is quadratic in nesting depth (40,000 nested ``<div>`` take it 4.6 s, 2 MB
of them many minutes), so :func:`page_text` runs it in a child process that is killed when its caller
stops waiting: a C call on a thread cannot be stopped, and such a thread held a core, and web_fetch's
one conversion slot, for minutes after the tool's timeout. The bot itself never imports selectolax.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import sys
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


class ConversionError(Exception):
    """The page could not be turned into text (the converter failed, or died)."""


async def page_text(html: str, *, cpu_seconds: float) -> str:
    """:func:`html_to_text` in a child process, killed when the caller stops waiting (cancelled).

    A process per page, not a long-lived one: nothing to restart after a kill or to stop at exit. It
    costs about 50 ms to start and 15 MB besides the page's tree (measured with Python 3.11; a 2 MB
    ordinary page takes 0.5 s and 100 MB in all, as it took on a thread), small beside a fetch.
    ``cpu_seconds`` also limits the child itself (rounded up to whole seconds): should the bot die
    without killing it, it still ends.
    """
    child = await asyncio.create_subprocess_exec(
        *(
            sys.executable,
            "-I",
            __file__,
            str(math.ceil(cpu_seconds)),
        ),  # -I: no PYTHON* variables, nor its folder on the path
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_child_env(),
        # A session of its own, as the shell tool's sandbox: a terminal's Ctrl-C (SIGINT to the whole
        # foreground group) is the bot's graceful shutdown, in which running turns go on, not this page's end.
        start_new_session=True,
    )
    try:
        out, err = await child.communicate(html.encode("utf-8", "surrogatepass"))
    finally:
        if child.returncode is None:  # cancelled: a page lexbor needs minutes for ends now
            child.kill()
            await child.wait()
    if child.returncode != 0:  # lexbor refused the page, or the CPU limit (or the kernel) ended it
        said = err.decode("utf-8", "replace").strip().splitlines()
        raise ConversionError(
            said[-1][:300] if said else f"the converter ended with status {child.returncode}"
        )
    return out.decode("utf-8", "surrogatepass")


# What a Python may need to start (a build's shared libraries): the child parses hostile pages, so the
# bot's secrets in its environment (MEMBOT_LLM__OPENAI__API_KEY, the chat tokens) stay out of it.
_CHILD_ENV = ("PATH", "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "TMPDIR")


def _child_env() -> dict[str, str]:
    return {name: os.environ[name] for name in _CHILD_ENV if name in os.environ}


def _convert_stdin(cpu_seconds: int) -> None:
    """The child's side: the page on stdin, its text on stdout, within ``cpu_seconds`` of CPU time."""
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    html = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
    sys.stdout.buffer.write(html_to_text(html).encode("utf-8", "surrogatepass"))


if __name__ == "__main__":
    _convert_stdin(int(sys.argv[1]))
