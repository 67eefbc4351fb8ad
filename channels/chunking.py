"""Splitting a long Markdown reply into chunks that each fit a platform's message limit.

Telegram counts 4096 UTF-16 code units, Discord 2000 characters; both channels call
:func:`split_message` with their limit and a ``measure`` for it. Splits fall at the best boundary
available: between paragraphs, then between lines, then between words, and only inside a word when a
single word is longer than a whole message. A fenced code block is never cut open: when it has to span
chunks, the chunk ends with a closing fence and the next one starts by reopening it with the same
language, so every chunk renders on its own.

>>> split_message("first paragraph\\n\\nsecond paragraph", 20)
['first paragraph', 'second paragraph']
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

Measure = Callable[[str], int]

# CommonMark fences: up to 3 spaces of indent, 3+ backticks or tildes, then an info string.
_FENCE_OPEN = re.compile(r"^ {0,3}(?P<marker>`{3,}|~{3,})(?P<info>.*)$")

# A split never leaves a chunk smaller than this share of the limit just to reach a nicer boundary.
_MIN_FILL = 0.5


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, the unit Telegram counts (an emoji outside the BMP counts 2)."""
    return len(text.encode("utf-16-le")) // 2


def split_message(text: str, limit: int, *, measure: Measure = len) -> list[str]:
    """Split ``text`` into chunks with ``measure(chunk) <= limit``, keeping code fences balanced.

    ``measure`` must be additive over concatenation (``len`` and :func:`utf16_len` are). Whitespace at
    a split point is dropped; everything else is kept, in order. An empty or blank text gives ``[]``.
    """
    if limit < 16:
        raise ValueError(f"limit {limit} is too small to split a message into readable chunks")
    if not text.strip():
        return []
    if measure(text) <= limit:
        return [text]
    packer = _Packer(limit, measure)
    for block in _blocks(text):
        packer.add_block(block)
    return packer.finish()


@dataclass(slots=True)
class _Block:
    """A paragraph (no blank line inside) or a whole fenced code block, and what separated it."""

    lines: list[str]
    separator: str  # the newlines before it in the original text ("" for the first block)
    fence: _Fence | None = None


@dataclass(frozen=True, slots=True)
class _Fence:
    opening: str  # the opening line as written, without indentation (keeps the language)
    closing: str  # a closing line that matches it

    @classmethod
    def parse(cls, line: str) -> _Fence | None:
        match = _FENCE_OPEN.match(line)
        if match is None:
            return None
        marker = match["marker"]
        if marker[0] == "`" and "`" in match["info"]:
            return None  # not a fence: backtick info strings may not contain backticks
        return cls(line.lstrip(), marker)

    def closes(self, line: str) -> bool:
        stripped = line.strip()
        char = self.closing[0]
        return (
            len(line) - len(line.lstrip(" ")) <= 3
            and len(stripped) >= len(self.closing)
            and stripped == char * len(stripped)
        )


def _blocks(text: str) -> Iterator[_Block]:
    """Cut the text into paragraphs and fenced code blocks (blank lines inside a fence stay in it)."""
    lines = text.split("\n")
    previous_end: int | None = None  # index of the last line of the previous block

    def block(start: int, end: int, fence: _Fence | None = None) -> _Block:
        nonlocal previous_end
        separator = "" if previous_end is None else "\n" * (start - previous_end)
        previous_end = end
        return _Block(lines[start : end + 1], separator, fence)

    i = 0
    while i < len(lines):
        fence = _Fence.parse(lines[i])
        if fence is not None:
            end = i + 1
            while end < len(lines) and not fence.closes(lines[end]):
                end += 1
            end = min(end, len(lines) - 1)  # an unclosed fence runs to the end of the text
            yield block(i, end, fence)
            i = end + 1
        elif not lines[i].strip():
            i += 1
        else:
            end = i
            while end + 1 < len(lines) and lines[end + 1].strip() and _Fence.parse(lines[end + 1]) is None:
                end += 1
            yield block(i, end)
            i = end + 1


class _Packer:
    """Greedy filling of chunks, block by block, falling back to lines, words and characters."""

    def __init__(self, limit: int, measure: Measure) -> None:
        self._limit = limit
        self._measure = measure
        self._chunks: list[str] = []
        self._current = ""
        self._size = 0

    # -- chunk bookkeeping --------------------------------------------------------------------------

    def _room(self, separator: str) -> int:
        """What still fits in the current chunk after ``separator`` (no separator on an empty chunk)."""
        if not self._current:
            return self._limit
        return self._limit - self._size - self._measure(separator)

    def _append(self, separator: str, piece: str) -> None:
        if self._current:
            self._current += separator + piece
            self._size += self._measure(separator) + self._measure(piece)
        else:
            self._current, self._size = piece, self._measure(piece)

    def _flush(self) -> None:
        if self._current.strip():
            self._chunks.append(self._current.strip("\n"))
        self._current, self._size = "", 0

    def finish(self) -> list[str]:
        self._flush()
        return self._chunks

    # -- blocks -------------------------------------------------------------------------------------

    def add_block(self, block: _Block) -> None:
        whole = "\n".join(block.lines)
        size = self._measure(whole)
        if size <= self._room(block.separator):
            self._append(block.separator, whole)
            return
        if size <= self._limit or self._size >= self._limit * _MIN_FILL:
            self._flush()  # the block fits a chunk of its own, or this chunk is full enough
            if size <= self._limit:
                self._append("", whole)
                return
        if block.fence is not None:
            self._add_fenced(block, block.fence)
        else:
            self._add_lines(block)

    def _add_lines(self, block: _Block) -> None:
        separator = block.separator
        for line in block.lines:
            self._add_line(separator, line)
            separator = "\n"

    def _add_line(self, separator: str, line: str) -> None:
        if self._measure(line) <= self._room(separator):
            self._append(separator, line)
            return
        self._flush()
        if self._measure(line) <= self._limit:
            self._append("", line)
            return
        for piece in self._pieces(line, self._limit):
            self._add_line(" ", piece)

    def _add_fenced(self, block: _Block, fence: _Fence) -> None:
        """A code block larger than a chunk: close and reopen the fence at every chunk boundary."""
        opening, closing = fence.opening, fence.closing
        overhead = self._measure(opening) + self._measure(closing) + 2  # two newlines
        if self._limit - overhead < 8:
            # An opening line too long to repeat in every chunk (a model repeating "`" thousands of
            # times, a huge info string) cannot reopen the block: its lines go out as they are.
            self._add_lines(block)
            return
        body = block.lines[1:]
        closed = bool(body) and fence.closes(body[-1])
        if closed:
            body = body[:-1]
        reserve = self._measure(closing) + 1  # the "\n" + closing fence the chunk may still need
        separator = block.separator
        is_open = False  # whether the current chunk holds the opening fence
        for line in body:
            if self._measure(line) <= self._limit - overhead:
                pieces: Iterator[str] = iter([line])
            else:
                pieces = self._pieces(line, self._limit - overhead, keep_spaces=True)
            for piece in pieces:
                needed = self._measure(piece) + reserve
                if not is_open:
                    if self._measure(opening) + 1 + needed > self._room(separator):
                        self._flush()
                    self._append(separator, opening)
                    is_open = True
                elif needed > self._room("\n"):
                    self._append("\n", closing)
                    self._flush()
                    self._append("", opening)
                self._append("\n", piece)
        if not is_open:  # an empty code block
            if self._measure(opening) + reserve > self._room(separator):
                self._flush()
            self._append(separator, opening)
        if closed:
            # The closing line as written, unless it outgrows the room kept for it (a run of backticks
            # a model repeated): the fence's own marker closes the block the same way.
            last = block.lines[-1]
            self._append("\n", last if self._measure(last) <= self._room("\n") else closing)

    # -- oversize lines -----------------------------------------------------------------------------

    def _pieces(self, line: str, limit: int, *, keep_spaces: bool = False) -> Iterator[str]:
        """Cut one line into pieces of at most ``limit``: at spaces, else (one huge word) anywhere.

        Prose pieces drop the space they were cut at (the chunk boundary replaces it); code keeps
        every character so that joining the pieces gives the line back.
        """
        words = re.split(r"(?<= )", line) if keep_spaces else line.split(" ")
        joiner = "" if keep_spaces else " "
        current = ""
        for word in words:
            candidate = f"{current}{joiner}{word}" if current else word
            if self._measure(candidate) <= limit:
                current = candidate
                continue
            if current and not keep_spaces:
                head, rest = _outside_markup(current, limit * _MIN_FILL, self._measure)
                if rest:
                    yield head
                    current = rest
                    candidate = f"{current} {word}"
                    if self._measure(candidate) <= limit:
                        current = candidate
                        continue
            if current:
                yield current
            while self._measure(word) > limit:
                cut = self._fit(word, limit)
                yield word[:cut]
                word = word[cut:]
            current = word
        if current:
            yield current

    def _fit(self, text: str, limit: int) -> int:
        """How many leading characters of ``text`` fit in ``limit`` (at least one)."""
        total = 0
        for index, char in enumerate(text):
            total += self._measure(char)
            if total > limit:
                return max(index, 1)
        return len(text)


def _outside_markup(prose: str, least: float, measure: Measure) -> tuple[str, str]:
    """``prose`` cut at its last space outside a link, code span or bold/italic/strike span, with the
    head at least ``least`` long: ``(head, rest)``; ``(prose, "")`` when its end is outside them already,
    or there is no such space.

    Each part is rendered on its own (Telegram) or by the platform (Discord): a cut inside
    ``[a link](url)`` or ``**bold words**`` would show the raw Markdown halves in two messages.
    """
    if not _opens_markup(prose):
        return prose, ""  # a cut after it is outside already
    cut = len(prose)
    while (cut := prose.rfind(" ", 0, cut)) > 0:
        head = prose[:cut]
        if measure(head) < least:
            break
        if not _opens_markup(head):
            return head, prose[cut + 1 :]
    return prose, ""


def _opens_markup(text: str) -> bool:
    """Whether ``text`` ends inside an inline Markdown span (counted, not parsed: a stray mark only
    moves a cut to an earlier space)."""
    if text.count("`") % 2 or text.rfind("[") > text.rfind("]"):
        return True
    link = text.rfind("](")
    if link != -1 and text.find(")", link) == -1:
        return True
    return (
        any(text.count(mark) % 2 for mark in ("**", "__", "~~")) or text.replace("**", "").count("*") % 2 == 1
    )
