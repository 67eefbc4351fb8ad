"""Long files read one page at a time, and the rule that replacing a file needs all of it seen first.

The tool loop cuts any result over ``tools.result_max_chars`` in the middle (``pipeline.tool_calls.cap``).
A model that wrote such a view back deleted everything that was cut (272 of 600 MEMORY.md lines) and
wrote the cut marker into the file. So the files tool pages long reads itself, by whole lines and under
that limit, says which lines it showed and how to get the next page, and remembers per conversation
which lines of which version of a file the model has seen: a whole-file write after a partial read is
refused (an append is fine), and so is any content carrying a cut marker.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass

# The marker of pipeline.tool_calls.cap ("[... 123 characters cut ...]"); tests keep the two in step.
CUT_MARKER = re.compile(r"\[\.\.\. ?\d+ characters cut \.\.\.\]")
PAGE_NOTE = "[page: lines "  # opens the footer of a partial read, also refused in written content


@dataclass(frozen=True, slots=True)
class Page:
    """Lines ``first``..``last`` (1-based, inclusive) of a text of ``total`` lines."""

    text: str
    first: int
    last: int
    total: int
    line_cut: bool = False  # the last line shown is longer than a page and was cut

    @property
    def whole(self) -> bool:
        return self.first <= 1 and self.last >= self.total and not self.line_cut

    @property
    def seen(self) -> tuple[int, int]:
        """The lines shown in full."""
        return self.first, self.last - 1 if self.line_cut else self.last


def page_of(text: str, *, offset: int = 1, limit: int | None = None, max_chars: int) -> Page:
    """The page of ``text`` starting at line ``offset``: whole lines, at most ``limit`` and ``max_chars``."""
    lines = text.splitlines(keepends=True)
    total = len(lines)
    first = max(1, offset)
    if first > total:
        return Page("", first, first - 1, total)
    end = total if limit is None else min(total, first - 1 + max(1, limit))
    size, last = 0, first - 1
    for number in range(first, end + 1):
        size += len(lines[number - 1])
        if size > max_chars and last >= first:
            break
        last = number
        if size > max_chars:  # one line longer than a whole page: show its start
            return Page(lines[number - 1][:max_chars], first, last, total, line_cut=True)
    return Page("".join(lines[first - 1 : last]), first, last, total)


def footer(page: Page) -> str:
    """What the model reads after a partial page: which lines, and how to go on."""
    if page.total == 0:
        return ""
    if page.first > page.total:
        return f"{PAGE_NOTE}none; the file has {page.total} lines, start at offset=1]"
    if page.whole:
        return ""
    shown = f"{PAGE_NOTE}{page.first}-{page.last} of {page.total}"
    if page.line_cut:
        shown += f"; line {page.last} is longer than a page and was cut (use action 'search')"
    after = page.last + 1 if page.last < page.total else None
    nxt = f"; next page: read again with offset={after}" if after else ""
    return (
        f"{shown}{nxt}. This is only part of the file: to replace the whole file read every page "
        "first; to add to it use action 'append'.]"
    )


@dataclass(slots=True)
class _Seen:
    digest: str
    total: int
    ranges: list[tuple[int, int]]

    def whole(self) -> bool:
        if self.total == 0:
            return True
        reach = 0
        for first, last in sorted(self.ranges):
            if first > reach + 1:
                return False
            reach = max(reach, last)
        return reach >= self.total


class ReadLog:
    """Per conversation and file: which lines of which version (content digest) the model has seen."""

    def __init__(self, max_entries: int = 1024) -> None:
        self._seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()
        self._max = max_entries

    def saw(self, session_id: str, path: str, digest: str, page: Page) -> None:
        key = (session_id, path)
        entry = self._seen.pop(key, None)
        if entry is None or entry.digest != digest:
            entry = _Seen(digest, page.total, [])
        first, last = page.seen
        if last >= first:
            entry.ranges.append((first, last))
        elif page.total == 0:
            entry.ranges.append((1, 0))
        self._seen[key] = entry
        while len(self._seen) > self._max:  # bounded: the oldest readings are forgotten first
            self._seen.popitem(last=False)

    def partial(self, session_id: str, path: str) -> bool:
        """True when the model last read only part of the version of ``path`` it saw."""
        entry = self._seen.get((session_id, path))
        return entry is not None and not entry.whole()

    def unseen(self, session_id: str, path: str, digest: str) -> str | None:
        """Why replacing the version ``digest`` of ``path`` would lose text the model has not seen:
        ``"unread"``, ``"changed"`` (it saw another version: an edit since), ``"partial"``; None when
        it has seen all of this version."""
        entry = self._seen.get((session_id, path))
        if entry is None:
            return "unread"
        if entry.digest != digest:
            return "changed"
        return None if entry.whole() else "partial"

    def forget(self, session_id: str, path: str) -> None:
        """After a write the model knows the whole text it wrote."""
        self._seen.pop((session_id, path), None)
