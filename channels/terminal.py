"""The terminal channel: ``membot chat`` as a REPL over the same dispatcher and pipeline as every chat.

At a terminal (stdin and stdout), input comes from a line editor (``channels/terminal_prompt.py``:
prompt_toolkit, with history) and what membot prints goes above the input line. Otherwise input lines
come from an asyncio stream (a pipe, a file; in tests a reader fed directly), one message per line, and
replies are printed as they arrive; stdin alone at a terminal (``membot chat | tee``) is read in the
kernel's line mode, where lines pasted together are one message (see :class:`TerminalChannel`). Session
id ``cli:<user>``. Ctrl-C while a reply is being written stops that turn (``bot/terminal_chat.py``
routes SIGINT, and the line editor's Ctrl-C key to :attr:`TerminalChannel.interrupt`); Ctrl-C at the
prompt or Ctrl-D ends the chat.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from typing import ClassVar

import structlog

from bot.domain import InboundMessage, OutboundMessage
from bot.printable import printable
from bot.retry import retry
from channels.base import Channel, InboundSink, PartialSink
from channels.outage import StorageOutage, is_storage_error
from channels.terminal_io import LineEditor, Screen
from channels.terminal_lines import (
    PASTE_WINDOW,
    TERMINAL_LINE_LIMIT,
    StreamLines,
    has_cut_line,
    message_text,
)

log = structlog.get_logger(__name__)

_SHOWN_CHARS = 200  # of each unanswered message shown at start (its first line)

CUT_LINE_NOTICE = (
    f"⚠️ Not sent: a line of that message was cut by the terminal, which passes on only "
    f"{TERMINAL_LINE_LIMIT:,} bytes of a line, so its end was lost. Send long text with line breaks "
    "in it, or from a file: membot chat < message.txt"
)

# Told once per message the inbox cannot store yet (a full disk): the line is held in this process only.
STORAGE_NOTICE = (
    "⚠️ I can't save your message right now (the server's disk refuses writes). I'll keep trying and "
    "answer it once it is saved; if you quit before that, it is lost."
)
FAILED_NOTICE = "⚠️ Sorry, I couldn't take that message in (the details are in the log). Please send it again."


class TerminalChannel(Channel):
    """The terminal as a channel: reads what the user types, prints the replies.

    ``join_pastes`` (``membot chat`` sets it when stdin is a terminal) makes a multi-line paste one
    message: every line that arrives within 50 ms of the previous one joins it, so a pasted snippet, log
    or email is answered once, whole (each line was a message of its own: a 4,000-line paste cost ~300
    model calls, and a snippet's first answer was to its first line alone). Without it (pipes and files)
    each line is a message, as scripts expect.

    Why a time window and not the terminal's own signal, bracketed paste (``ESC[?2004h``, which wraps a
    paste in ``ESC[200~`` … ``ESC[201~``): the terminal is read in canonical mode, so that the kernel
    does the line editing (Backspace, Ctrl-U, Ctrl-W) and hands over whole lines. In that mode the end
    marker that follows a paste's last newline stays in the kernel's line buffer until the next Enter,
    so the paste's end is not seen until the user types again, and the start marker is echoed as
    ``^[[200~``. Bracketed paste needs raw mode and a line editor: ``editor`` below, used when stdout
    is a terminal too (the line editor's input line needs the screen). The window's cost: lines typed
    ahead while membot's loop was busy for longer than that are joined too, which the dispatcher's
    collect mode would do anyway.

    ``editor`` (at a terminal: stdin and stdout) replaces ``reader``: a line editor reads the keys
    itself, so nothing is echoed into a streaming answer and no line is cut, and it marks pastes. Its
    input line is erased when a message is sent; the channel prints "you › <message>" where it belongs:
    at once, or, while an answer is being written, after that answer (or before a command's reply that
    comes in the middle of it), so the answer's text stays whole on the screen.
    """

    name: ClassVar[str] = "cli"

    def __init__(
        self,
        submit: InboundSink,
        *,
        user: str,
        reader: asyncio.StreamReader | None = None,
        writer: Screen,
        editor: LineEditor | None = None,
        prompt: str = "you › ",
        stream_replies: bool = True,
        join_pastes: bool = False,
    ) -> None:
        super().__init__(submit)
        self._user = user
        if (reader is None) == (editor is None):
            raise ValueError("a terminal channel reads from a stream or from a line editor: pass one")
        self._editor = editor
        # What Ctrl-C at the line editor does (membot chat sets its SIGINT handler): by default, quit.
        self.interrupt: Callable[[], None] = self.close
        self._held: list[str] = []  # messages sent while an answer streams, shown after it
        self._handing: asyncio.Task[None] | None = None  # the line editor's last message, handed over
        window = PASTE_WINDOW if join_pastes else None
        self._lines = None if reader is None else StreamLines(reader, paste_window=window)
        self._at_terminal = join_pastes  # membot chat joins pastes exactly when stdin is a terminal
        self._writer = writer
        self._prompt = prompt
        self._stream = stream_replies
        self._task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._streamed = ""
        self._interrupted = False  # a reply was printed below the streaming answer (see send)
        self._waiting = 0
        self._outage = StorageOutage("taking terminal messages in", health=self.health)

    @property
    def chat_id(self) -> str:
        return self._user

    @property
    def session_id(self) -> str:
        return f"{self.name}:{self._user}"

    async def start(self) -> None:
        self.health.state = "running"
        self._task = asyncio.create_task(self._read_loop(), name="terminal-input")
        self._show_prompt()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._handing is not None:
            self._handing.cancel()
            await asyncio.gather(self._handing, return_exceptions=True)
        if self._editor is not None:
            await self._editor.drain()
        self.health.state = "stopped"
        self._closed.set()

    async def wait_closed(self) -> None:
        """Returns when the user ended the chat (EOF, /quit or /exit)."""
        await self._closed.wait()

    def close(self) -> None:
        self._closed.set()
        if self._editor is not None:
            self._editor.close()

    def notice(self, text: str) -> None:
        """A line from membot itself (not a reply), followed by a fresh prompt."""
        # On a line of its own: after the prompt, or a streaming answer's unfinished line (the line
        # editor's prompt is not in what is written, and its screen has a line open only mid-answer).
        opened = self._editor is None or bool(self._streamed)
        self._writer.write(f"\n{text}\n" if opened else f"{text}\n")
        self._streamed = ""
        self._interrupted = False
        self._show_held()
        self._show_prompt()

    def show_unanswered(self, texts: Sequence[str]) -> None:
        """Before :meth:`start`: the messages a previous run took and did not answer (it was killed or
        its terminal closed), which are answered first. The new terminal does not show what was typed,
        so without this an answer would come to a question the user cannot see."""
        if not texts:
            return
        self._writer.write("membot stopped before it answered:\n")
        for text in texts:
            first, *more = text.splitlines() or [""]
            cut = more or len(first) > _SHOWN_CHARS
            self._writer.write(f"  {self._prompt}{printable(first[:_SHOWN_CHARS])}{' …' if cut else ''}\n")

    @property
    def waiting_for_reply(self) -> bool:
        """A message was typed and its reply has not been printed yet (Ctrl-C then stops, not quits)."""
        return self._waiting > 0

    def answer_stopped(self) -> None:
        """The running turn was stopped (and with it the queued ones): no reply is coming."""
        self._waiting = 0
        self.notice("[stopped]")

    async def _read_loop(self) -> None:
        if self._editor is not None:
            with self._editor.keys_held():
                await self._edit_loop(self._editor)
            if self._handing is not None:
                # The end of input waits until what was typed before it is taken in, with the terminal
                # back in line mode: no input line reads keys now, and Ctrl-C must still quit (SIGINT,
                # to membot chat's handler) while a full disk holds a message back.
                await self._handing
            self._closed.set()
            return
        assert self._lines is not None  # (a stream when there is no line editor: see __init__)
        while True:
            raw = await self._lines.read_message()
            if not raw:
                break
            if self._at_terminal and not raw.endswith(b"\n"):
                # Ctrl-D mid-line sends the line without an Enter: the cursor is still after the echoed
                # text, and the reply's "\rmembot › " wrote over the question instead of below it.
                self._writer.write("\n")
            if self._at_terminal and has_cut_line(raw):
                self.notice(CUT_LINE_NOTICE)  # what the model would answer is not what was typed
                continue
            text = message_text(raw)
            if not text:
                self._show_prompt()
                continue
            if text in ("/quit", "/exit"):
                break
            self._waiting += 1
            # An id of its own, as a platform gives one: a turn killed after its tools ran is answered
            # again at the next start, and finds what they did by it (bot/tools/journal.py).
            message_id = uuid.uuid4().hex
            await self._hand_over(
                InboundMessage(self.name, self._user, self._user, text, message_id=message_id)
            )
        self._closed.set()

    async def _hand_over(self, message: InboundMessage) -> None:
        """Hand a typed message to the dispatcher, again and again while storage refuses it (a full disk,
        a read-only workspace), the user told once: no platform sends a typed line again, so it is held
        here until the inbox has it. Any other failure costs that message only, said on the screen: the
        terminal keeps reading (its read loop ended with the error, and nothing typed later was read)."""

        def failed(exc: Exception, tries: int, delay: float) -> None:
            self._outage.failed(exc)
            if tries == 1:
                self.notice(STORAGE_NOTICE)

        try:
            await retry(
                lambda: self.handle_inbound(message),
                retry_if=lambda exc, tries: is_storage_error(exc),
                wait=lambda exc, tries: self._outage.delay(tries),
                on_retry=failed,
                sleep=self._outage.pause,
            )
        except Exception:
            log.exception("terminal_message_failed")
            self._outage.given_up()  # nothing waits for storage now: /healthz no longer says so
            self._waiting = max(0, self._waiting - 1)
            self.notice(FAILED_NOTICE)
            return
        self._outage.recovered()

    async def _edit_loop(self, editor: LineEditor) -> None:
        """The line editor's messages. Each is handed over in a task of its own, after the one before
        it, while the next is read: the input line is back at once, so keys typed meanwhile (Ctrl-C
        and Ctrl-D too) reach it, even while a full disk holds a message back (see :meth:`_hand_over`).
        The end of input then waits until what was typed before it is taken in (:meth:`_read_loop`)."""
        while True:
            try:
                typed = await editor.read()
            except KeyboardInterrupt:
                self.interrupt()
                if self._closed.is_set():
                    return
                continue
            if typed is None:
                break
            # (Undecodable bytes come as lone surrogates: back to bytes, shown as U+FFFD, as from a pipe.)
            text = message_text(typed.encode("utf-8", "surrogateescape"))
            if not text:
                continue
            self._echo(typed)
            if text in ("/quit", "/exit"):
                break
            self._waiting += 1
            message = InboundMessage(self.name, self._user, self._user, text, message_id=uuid.uuid4().hex)
            self._handing = asyncio.create_task(self._hand_over_after(self._handing, message))

    async def _hand_over_after(self, before: asyncio.Task[None] | None, message: InboundMessage) -> None:
        if before is not None:
            await before
        await self._hand_over(message)

    def _echo(self, typed: str) -> None:
        """Show what was sent (the line editor erased its input line): below the streaming answer."""
        shown = printable(typed.strip("\n"))
        line = f"{self._prompt}{shown}\n"
        if self._streamed:
            self._held.append(line)
        else:
            self._writer.write(line)

    def _show_held(self) -> None:
        for line in self._held:
            self._writer.write(line)
        self._held.clear()

    async def send(self, message: OutboundMessage) -> None:
        self._waiting = max(0, self._waiting - 1)
        self.health.sent += 1
        if message.aside and self._streamed:
            # A command's reply while an answer streams: on a line of its own, and the answer goes on
            # after it from where it was, never printed again from its start.
            if not self._interrupted:
                self._writer.write("\n")
            self._interrupted = True
            self._show_held()  # the command was typed after the answer began: shown before its reply
            self._write_reply(message)
        elif self._streamed and message.text.startswith(self._streamed):
            # The stream already showed the beginning; print only what it had not shown yet.
            rest = message.text[len(self._streamed) :]
            self._streamed = ""
            if self._interrupted:
                self._interrupted = False
                if not rest:
                    self._show_held()
                    return  # all of it was on the screen before the reply that came between
                self._writer.write("\rmembot › …")
            self._writer.write(printable(rest) + "\n")
            self._show_held()
        else:
            if self._streamed and not self._interrupted:
                self._writer.write("\n")
            self._streamed = ""
            self._interrupted = False
            self._write_reply(message)
            self._show_held()
        self._show_prompt()

    def _write_reply(self, message: OutboundMessage) -> None:
        marked = not message.is_error or message.text.startswith("⚠️")  # one warning sign is enough
        marker = "" if marked else "! "
        self._writer.write(f"membot › {marker}{printable(message.text)}\n")

    def partial_sink(self, chat_id: str, reply_to: str | None = None) -> PartialSink | None:
        if not self._stream:
            return None

        async def show(text_so_far: str) -> None:
            if not text_so_far.startswith(self._streamed):
                return
            if not self._streamed:
                self._writer.write("\rmembot › ")
            elif self._interrupted:  # a command's reply came between: the answer goes on below it
                self._writer.write("\rmembot › …")
                self._interrupted = False
            self._writer.write(printable(text_so_far[len(self._streamed) :]))
            self._writer.flush()
            self._streamed = text_so_far

        return show

    def _show_prompt(self) -> None:
        if self._editor is not None:
            return  # the line editor draws its own
        self._writer.write(self._prompt)
        self._writer.flush()
