"""Where the terminal channel reads: standard input as an asyncio stream (pipes, files, and a terminal
read in the kernel's line mode), or the line editor at a terminal."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from channels.terminal_prompt import PromptTerminal


class Screen(Protocol):
    """Where the channel prints: stdout, or the line editor's screen above its input line."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class LineEditor(Protocol):
    """Input read by a line editor (``channels/terminal_prompt.py``) instead of a stream."""

    async def read(self) -> str | None:
        """The next message; None at the end of input; raises KeyboardInterrupt on Ctrl-C."""
        ...

    def close(self) -> None:
        """End a waiting :meth:`read` (it returns None)."""
        ...

    async def drain(self) -> None:
        """Until everything written is on the screen."""
        ...

    def keys_held(self) -> AbstractContextManager[None]:
        """Keys typed while no :meth:`read` waits are kept for the next one, not echoed or read as
        signals by the kernel (its line mode would echo them into the screen and lose a Ctrl-D)."""
        ...


async def line_editor(prompt: str, history_file: Path) -> PromptTerminal:
    """The line editor for ``membot chat`` at a terminal (stdin and stdout), with the arrow keys'
    history in ``history_file``. prompt_toolkit is imported here: only this path loads it."""
    from channels.terminal_prompt import PromptTerminal, private_history

    return PromptTerminal(prompt, await private_history(history_file))


async def stdin_reader() -> asyncio.StreamReader:
    """An asyncio reader over this process's standard input: a terminal, a pipe or a file.

    A terminal, a pipe or a socket is watched by the event loop. Anything else (``membot chat <
    questions.txt``, ``< /dev/null``) cannot be: a regular file is refused by ``connect_read_pipe`` and
    epoll refuses ``/dev/null``, so it is read in a thread instead, where a read never waits for a person.
    """
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    mode = os.fstat(sys.stdin.fileno()).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or sys.stdin.isatty():
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    else:
        task = asyncio.create_task(_read_file(sys.stdin.fileno(), reader), name="terminal-file-input")
        _file_readers.add(task)
        task.add_done_callback(_file_readers.discard)
    return reader


_file_readers: set[asyncio.Task[None]] = set()  # referenced until done: the loop keeps only weak ones


async def _read_file(fd: int, reader: asyncio.StreamReader) -> None:
    while chunk := await asyncio.to_thread(os.read, fd, 1 << 16):
        reader.feed_data(chunk)
    reader.feed_eof()
