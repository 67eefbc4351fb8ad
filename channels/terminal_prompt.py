"""The terminal channel's input at a terminal: prompt_toolkit's line editor, with output printed above it.

Imported only when ``membot chat`` runs with stdin and stdout on a terminal (``bot/app.py``), so that
``membot --help`` and ``membot run`` never load prompt_toolkit.

Why not the kernel's line editing (canonical mode, which pipes still use): the kernel echoes what is
typed wherever the cursor is, so a line typed while an answer streams landed inside the answer; and it
passes on at most MAX_CANON bytes of a line (4,095 on Linux, 1,024 on macOS), cutting a long typed or
pasted line. prompt_toolkit reads the keys itself (raw mode), keeps the input line at the bottom, and
gives line editing and arrow-key history.

What membot prints goes above the input line (:meth:`PromptTerminal.write`): a whole line is printed
there, and the line a streamed answer is still writing is shown just above the prompt, as part of it,
until it ends (a line printed half, then continued, would be drawn over by the prompt).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path

import structlog
from prompt_toolkit import PromptSession
from prompt_toolkit.application import run_in_terminal
from prompt_toolkit.filters import is_searching
from prompt_toolkit.history import History
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.keys import Keys

from bot.storage import append_bytes, atomic_write_bytes, line_bytes

log = structlog.get_logger(__name__)

HISTORY_CAP = 1000  # messages kept for the arrow keys; the file is cut back to these when twice as long


class PromptTerminal:
    """The input line (:meth:`read`) and the screen above it (:meth:`write`, the channel's writer)."""

    def __init__(self, prompt: str, history: History | None = None) -> None:
        self._prompt = prompt
        self._pending = ""  # the line being written above the prompt, not ended yet
        self._prints: set[asyncio.Future[None]] = set()  # lines on their way above the input line
        self._session: PromptSession[str] = PromptSession(
            history=history,
            key_bindings=_paste_bindings(),
            erase_when_done=True,  # the channel prints what was sent where it belongs (TerminalChannel)
            enable_suspend=True,  # Ctrl-Z, as in the kernel's line mode
        )

    async def read(self) -> str | None:
        """The next message typed (a paste included); None when the user ends the chat (Ctrl-D on an
        empty line, or the terminal closed). Ctrl-C raises :class:`KeyboardInterrupt`."""
        try:
            return await self._session.prompt_async(
                self._message,
                # Ctrl-C is a key press here (the terminal is in raw mode): the channel hands it to
                # membot chat's own handler, which stops an answer or quits. prompt_toolkit's SIGINT
                # handler would replace that handler, and its exception handler the loop's.
                handle_sigint=False,
                set_exception_handler=False,
            )
        except EOFError:
            return None
        except OSError:  # the terminal is gone (EIO after a hang-up): as the end of input
            return None

    def keys_held(self) -> AbstractContextManager[None]:
        """The terminal in raw mode for the whole chat, not only while an input line is shown (as
        prompt_toolkit does): keys typed between two inputs wait for the next one, unechoed, and a
        Ctrl-D stays a key (the kernel's line mode echoed them onto the screen, and turned a Ctrl-D
        into an end of input that raw mode then lost, so the chat did not end)."""
        return self._session.input.raw_mode()

    def close(self) -> None:
        """End a :meth:`read` that waits (it returns None), so the input line leaves the screen."""
        app = self._session.app
        if app.is_running and app.future is not None and not app.future.done():
            app.exit(exception=EOFError())

    def _message(self) -> str:
        # While lines wait to be printed above, the unfinished one would show before them: not yet.
        tail = "" if self._prints else self._pending
        return f"{tail}\n{self._prompt}" if tail else self._prompt

    def write(self, text: str, /) -> int:
        """Show ``text`` above the input line: its whole lines at once, its unfinished last line as
        part of the prompt until the line ends. A carriage return (the line-mode screen's way to write
        over its own prompt) has nothing to do here: the input line is never in the printed text."""
        self._pending += text.replace("\r", "")
        app = self._session.app
        if "\n" in self._pending:
            done, self._pending = self._pending.rsplit("\n", 1)
            self._print(done + "\n")
        elif app.is_running:
            app.invalidate()
        return len(text)

    def flush(self) -> None:
        """(Every write is shown at once.)"""

    def _print(self, text: str) -> None:
        output = self._session.output

        def show() -> None:
            output.write(text)  # (escape characters written as "?": the channel made them visible)
            output.flush()

        if not self._session.app.is_running and not self._prints:
            show()
            return
        # Erases the input line, prints, draws it again below; in order, after the prints before it.
        task = asyncio.ensure_future(self._print_after(list(self._prints), show))
        self._prints.add(task)
        task.add_done_callback(self._printed)

    async def _print_after(self, before: list[asyncio.Future[None]], show: Callable[[], None]) -> None:
        await asyncio.gather(*before, return_exceptions=True)
        await run_in_terminal(show)  # (at once when no input line is shown)

    def _printed(self, task: asyncio.Future[None]) -> None:
        self._prints.discard(task)
        if self._session.app.is_running:
            self._session.app.invalidate()

    async def drain(self) -> None:
        """Until what was written is on the screen (printed above the input line in turn)."""
        await asyncio.gather(*self._prints, return_exceptions=True)


def _paste_bindings() -> KeyBindings:
    """A paste is one message, as it was in line mode (``TerminalChannel``'s ``join_pastes``).

    A terminal that marks pastes (bracketed paste, which prompt_toolkit turns on) gives the whole paste
    as one key event: it goes into the input line, and a paste that ends with a line break is sent, as
    Enter after it would. A terminal that does not mark them types the paste: its line breaks come as
    Enter keys in the same read as the text after them, which a person's Enter never is, so such an
    Enter is a line break in the message, not its end.
    """
    bindings = KeyBindings()

    @bindings.add(Keys.BracketedPaste)
    def _paste(event: KeyPressEvent) -> None:
        text = event.data.replace("\r\n", "\n").replace("\r", "\n")
        event.current_buffer.insert_text(text)
        if text.endswith("\n"):
            event.current_buffer.validate_and_handle()

    @bindings.add("enter", filter=~is_searching)
    def _enter(event: KeyPressEvent) -> None:
        if any(key.key != Keys.CPRResponse for key in event.key_processor.input_queue):
            event.current_buffer.insert_text("\n")
        else:
            event.current_buffer.validate_and_handle()

    return bindings


async def private_history(path: Path) -> History:
    """The arrow keys' history across runs, read from ``path`` (in a thread) before the first prompt,
    so that an arrow key pressed at once finds it."""
    return _PrivateHistory(path, await asyncio.to_thread(_read_history, path))


class _PrivateHistory(History):
    """One JSON string a line (a message can span lines), in a private file (0600 in a 0700 folder:
    it holds what the user typed, as the sessions do).

    Appended in a thread of its own, in order, never on the event loop. Not fsynced: the messages
    themselves are kept by the inbox and the session; a power cut costs only a recent arrow-key entry,
    and a torn last line is skipped when read.
    """

    def __init__(self, path: Path, entries: list[str]) -> None:
        super().__init__()
        self._path = path
        self._entries = entries
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="terminal-history")

    def load_history_strings(self) -> Iterable[str]:
        return reversed(self._entries)  # newest first, as prompt_toolkit expects

    def store_string(self, string: str) -> None:
        self._writer.submit(self._append, string)

    def _append(self, string: str) -> None:
        try:
            append_bytes(self._path, line_bytes(json.dumps(string)), whole_lines=True, sync=False)
        except OSError:  # a full disk: the message itself is in the inbox; only the arrow keys miss it
            log.warning("terminal_history_not_saved", path=str(self._path), exc_info=True)


def _read_history(path: Path) -> list[str]:
    """The entries, oldest first; the file is cut back to the last :data:`HISTORY_CAP` (an atomic
    rewrite) once it holds twice that many."""
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    except OSError:
        log.warning("terminal_history_unreadable", path=str(path), exc_info=True)
        return []
    entries = [entry for entry in map(_entry, lines) if entry is not None]
    if len(entries) > 2 * HISTORY_CAP:
        entries = entries[-HISTORY_CAP:]
        try:
            atomic_write_bytes(path, b"".join(line_bytes(json.dumps(e)) for e in entries))
        except OSError:
            log.warning("terminal_history_not_trimmed", path=str(path), exc_info=True)
    return entries


def _entry(line: bytes) -> str | None:
    try:
        entry = json.loads(line)
    except ValueError:  # a line torn by a crash, or an edit
        return None
    return entry if isinstance(entry, str) else None
