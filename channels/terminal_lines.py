"""Input lines made messages: a stream's lines read whole, a paste's lines joined into one message, a
line the kernel cut found, and the text of what was typed.

A concept of its own, apart from the terminal channel (terminal.py) that hands the messages over and
prints the replies: what counts as one message depends only on bytes and their timing (a newline, the
50 ms paste window, the kernel's 4,095-byte line limit), not on the screen, the dispatcher or the
channel's state; and :func:`message_text` serves both ways the channel reads, a stream
(:class:`StreamLines`) and the line editor (terminal_prompt.py).
"""

from __future__ import annotations

import asyncio
import re

# A paste reaches a terminal's reader line after line without a pause (one line per read, microseconds
# apart, a few ms when the terminal writes a long paste in pieces), while a person needs well over 100 ms
# to type a line and press Enter again: a line that follows within this window belongs to the same paste.
PASTE_WINDOW = 0.05  # seconds

# A terminal in canonical mode (the kernel's line editing, see TerminalChannel in terminal.py) passes on
# at most this many bytes of one line: Linux keeps the first 4,095 and drops the rest of the line unseen,
# while the screen echoes all of it. A line that long was cut, and is not sent as if whole (has_cut_line).
TERMINAL_LINE_LIMIT = 4095


class StreamLines:
    """An input stream (a pipe, a file, a terminal in the kernel's line mode) read a message at a time.

    With ``paste_window`` (seconds) the lines that follow a line within it join its message (a paste);
    without it each line is a message, as scripts expect::

        lines = StreamLines(await stdin_reader(), paste_window=PASTE_WINDOW)
        while raw := await lines.read_message():
            text = message_text(raw)
    """

    def __init__(self, reader: asyncio.StreamReader, *, paste_window: float | None) -> None:
        self._reader = reader
        self._paste_window = paste_window

    async def read_message(self) -> bytes:
        """The next line, with the lines that follow it within the paste window (a paste); b"" at the
        end of input. A line that ends the input (no newline) ends the message too."""
        lines = [await self._read_line()]
        if self._paste_window is None:
            return lines[0]
        while lines[-1].endswith(b"\n") and (more := await self._read_line(self._paste_window)):
            lines.append(more)
        return b"".join(lines)

    async def _read_line(self, within: float | None = None) -> bytes:
        """One whole input line, however long (``readline`` gives up past the reader's 64 KiB limit
        and loses the line); b"" at the end of input, or when no line began to arrive ``within``
        seconds. The dispatcher truncates an oversized message with a note, so a huge paste is
        answered, not dropped."""
        parts: list[bytes] = []
        while True:
            try:
                # Only the wait for the first piece is timed: a cut readuntil leaves the reader's buffer
                # as it was, a cut after pieces were taken would lose them.
                async with asyncio.timeout(None if parts else within):
                    parts.append(await self._reader.readuntil(b"\n"))
            except TimeoutError:
                return b""
            except asyncio.IncompleteReadError as end:  # input ended without a final newline
                parts.append(end.partial)
            except asyncio.LimitOverrunError as over:  # no newline within the limit yet: take a piece
                parts.append(await self._reader.readexactly(over.consumed))
                continue
            return b"".join(parts)


def has_cut_line(raw: bytes) -> bool:
    """Whether a line of what a terminal passed on reached its limit: the kernel cut it there."""
    return any(len(line) >= TERMINAL_LINE_LIMIT for line in raw.split(b"\n"))


_BLANK_LINES = re.compile(r"\A(?:[ \t]*\n)+")


def message_text(raw: bytes) -> str:
    """What was typed, without surrounding blank space; a paste of several lines keeps its first
    line's indentation (a snippet copied from inside a function would lose its shape). Windows (CRLF)
    and old Mac (CR) line ends become ``\n``: the session and the model got ``\r\n`` (and lone ``\r``)
    as they came, from a file or pipe, or a terminal set not to translate CR (``stty -icrnl``). (A
    terminal that does translate, the default, turns a pasted CRLF into two line ends before membot
    reads it, indistinguishable from a blank line: that one is the terminal's to fix.)"""
    text = raw.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n").rstrip()
    if "\n" not in text.strip():
        return text.strip()
    return _BLANK_LINES.sub("", text)
