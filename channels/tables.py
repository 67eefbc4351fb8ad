"""Markdown tables for chats that cannot show them: the columns aligned, in monospace.

Neither Telegram nor Discord renders a Markdown table; its raw pipes in a proportional font are hard to
read, and models write tables often. Telegram's renderer lays out the cells markdown-it found
(channels/telegram/format.py, which also turns the tables of an answer that needs several messages into
code blocks from markdown-it's own parse, before the split: cells as its renderer shows them, emphasis
rendered away); Discord's answer goes as Markdown, so :func:`tables_as_code` turns each table into a
code block first, leaving code blocks alone.
"""

from __future__ import annotations

import re

CELL_WIDTH = 40  # characters a cell shows at most (a phone screen is narrow)
_ROW = re.compile(r"^\s*\|.*\|\s*$")
_RULE = re.compile(r"^\s*\|?(\s*:?-+:?\s*\|)+(\s*:?-+:?\s*)?$")
_MARKS = re.compile(r"\*\*|__|`")


def layout(rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, the header ruled off from the rest."""
    rows = [[_fit(cell) for cell in row] for row in rows]
    columns = max((len(row) for row in rows), default=0)
    rows = [row + [""] * (columns - len(row)) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(columns)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    if len(lines) > 1:
        lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def tables_as_code(markdown: str) -> str:
    """``markdown`` with each table (a row of pipes, a rule line, more rows) as an aligned code block."""
    lines = markdown.split("\n")
    out: list[str] = []
    fenced = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and _ROW.match(line) and i + 1 < len(lines) and _RULE.match(lines[i + 1]):
            rows = [_cells(line)]
            i += 2
            while i < len(lines) and _ROW.match(lines[i]):
                rows.append(_cells(lines[i]))
                i += 1
            out += ["```", layout(rows), "```"]
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def _cells(line: str) -> list[str]:
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [_MARKS.sub("", cell.replace("\\|", "|")).strip() for cell in re.split(r"(?<!\\)\|", inner)]


def _fit(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= CELL_WIDTH else text[: CELL_WIDTH - 1] + "…"
