"""``membot chat`` at a real terminal: the process runs on a pseudo-terminal, as under a terminal window.

membot reads the keys with a line editor (prompt_toolkit, in raw mode). A terminal emulator's paste
writes the whole text to the terminal at once; one that marks pastes wraps it in ``ESC[200~`` …
``ESC[201~``. The test answers the editor's cursor position requests as a terminal does, and reads
the screen as text without its control sequences.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import signal
import struct
import sys
import termios
from collections.abc import AsyncIterator
from pathlib import Path

from tests.bot.cli.membot_process import wait_in_flight
from tests.channels.telegram.kit import break_folder
from tests.fakes.llm_server import FakeLLMServer, FakeReply

# The child makes the pseudo-terminal its controlling terminal, as a login shell's is, then becomes
# membot: closing the terminal (its master side) then sends it SIGHUP, as closing a window does.
_ON_A_TERMINAL = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, [sys.executable, '-m', 'bot', 'chat'])"
)


_WHERE_IS_THE_CURSOR = b"\x1b[6n"
_CONTROL_SEQUENCE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


class TerminalChat:
    """A ``membot chat`` on a pseudo-terminal: we type into the terminal and read what it shows."""

    def __init__(self, process: asyncio.subprocess.Process, master: int) -> None:
        self.process = process
        self.master = master
        self._screen = b""
        asyncio.get_running_loop().add_reader(master, self._read)

    def _read(self) -> None:
        try:
            chunk = os.read(self.master, 4096)
        except OSError:  # EIO: every process closed the terminal
            chunk = b""
        if not chunk:
            asyncio.get_running_loop().remove_reader(self.master)
        asked = (self._screen[-3:] + chunk).count(_WHERE_IS_THE_CURSOR)
        self._screen += chunk
        for _ in range(asked):
            os.write(self.master, b"\x1b[1;1R")  # a terminal's answer (where is of no matter here)

    @property
    def screen(self) -> str:
        """What was shown, as text: control sequences (colours, cursor moves, erasing) left out."""
        text = _CONTROL_SEQUENCE.sub("", self._screen.decode("utf-8", "replace"))
        return text.replace("\r\n", "\n").replace("\r", "")

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    async def type_all(self, text: str) -> None:
        """Type a text longer than the terminal's input buffer: the writes wait for membot to read it,
        so they wait in a thread while this loop goes on reading what membot shows."""
        data = text.encode()
        while data:
            written = await asyncio.to_thread(os.write, self.master, data)
            data = data[written:]

    async def wait_for(self, text: str, timeout: float = 30) -> None:
        try:
            async with asyncio.timeout(timeout):
                while text not in self.screen:
                    assert self.process.returncode is None, f"membot chat exited:\n{self.screen}"
                    await asyncio.sleep(0.02)
        except TimeoutError:
            raise AssertionError(f"not shown in {timeout:g} s: {text!r}\n{self._screen!r}") from None

    def close_terminal(self) -> None:
        asyncio.get_running_loop().remove_reader(self.master)
        os.close(self.master)
        self.master = -1

    async def exit_code(self, timeout: float = 30) -> int:
        async with asyncio.timeout(timeout):
            return await self.process.wait()


@contextlib.asynccontextmanager
async def membot_chat_on_a_terminal(home: Path, llm: FakeLLMServer) -> AsyncIterator[TerminalChat]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBOT_")}
    env.update(
        HOME=str(home),
        MEMBOT_WORKSPACE=str(home / "ws"),
        MEMBOT_LLM__OPENAI__BASE_URL=llm.openai_base_url,
        MEMBOT_LLM__OPENAI__API_KEY="sk-test-key-123456",
        MEMBOT_TERMINAL__USER="ana",
    )
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))  # rows, columns
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _ON_A_TERMINAL,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=home,
            start_new_session=True,  # a session of its own, which the terminal can be controlling
        )
    finally:
        os.close(slave)
    chat = TerminalChat(process, master)
    try:
        await chat.wait_for("Ctrl-D to quit")
        yield chat
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        if chat.master >= 0:
            chat.close_terminal()


def chat_requests(llm: FakeLLMServer) -> list[str]:
    """The message each model request answered (its last user message)."""
    return [r.body["messages"][-1]["content"] for r in llm.requests]


SNIPPET = [
    "    def total(items):",
    "        # the first line's indentation is part of the paste",
    "        result = 0",
    "        for item in items:",
    "            if item is None:",
    "                continue",
    "            result += item",
    "        return result",
    "",
    "    print(total([1, 2, None, 3]))",
]


async def test_a_paste_is_one_message_and_lines_typed_apart_are_two(tmp_path: Path) -> None:
    """A 10-line paste reached the model line by line: a first answer to its first line alone, then the
    other nine (a 4,000-line paste cost ~300 model calls). Lines typed with a pause stay two messages."""
    async with FakeLLMServer() as llm, membot_chat_on_a_terminal(tmp_path, llm) as chat:
        chat.type("".join(line + "\n" for line in SNIPPET))  # what a terminal does with a paste
        await chat.wait_for("echo:")
        await chat.wait_for("print(total([1, 2, None, 3]))\nyou ›")
        assert chat_requests(llm) == ["\n".join(SNIPPET)]

        chat.type("first\n")
        await asyncio.sleep(0.3)
        chat.type("second\n")
        await chat.wait_for("echo: second\nyou ›")
        assert chat_requests(llm)[1:] == ["first", "second"]

        chat.type("\x04")  # Ctrl-D
        assert await chat.exit_code() == 0, chat.screen
    assert "bye — the conversation is saved." in chat.screen


async def test_closing_the_terminal_mid_answer_ends_the_chat_and_the_next_start_answers(
    tmp_path: Path,
) -> None:
    """Closing the window sends SIGHUP, which killed ``membot chat`` (exit -1). It now stops at once (no
    one would see the answer: it waits no grace period), exits 0, and the next start answers."""
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="never finished", delay=30))
        async with membot_chat_on_a_terminal(tmp_path, llm) as chat:
            chat.type("what was the question?\n")
            await wait_in_flight(llm)
            chat.close_terminal()
            assert await chat.exit_code(timeout=10) == 0  # well within the 20 s grace period
        llm.script(FakeReply(text="the answer"))
        async with membot_chat_on_a_terminal(tmp_path, llm) as chat:
            await chat.wait_for("membot › the answer\nyou ›")
            chat.type("\x04")
            assert await chat.exit_code() == 0, chat.screen
    assert "membot stopped before it answered:\n  you › what was the question?" in chat.screen
    assert chat_requests(llm) == ["what was the question?"] * 2


async def test_a_line_typed_while_an_answer_streams_stays_out_of_it_and_is_sent_after_it(
    tmp_path: Path,
) -> None:
    """In line mode the kernel echoed what was typed wherever the cursor was: in the middle of the
    answer being written ("membot › alpha betanext question" …). The line editor keeps it in its input
    line; sent, it is shown after the answer, whose text stays whole, and is the next message."""
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="alpha beta gamma delta epsilon zeta", stall_after=3, stall=2))
        async with membot_chat_on_a_terminal(tmp_path, llm) as chat:
            await chat.wait_for("you ›")
            chat.type("hi\r")
            await chat.wait_for("membot › alpha")
            chat.type("next question\r")  # typed and sent while the answer is being written
            await chat.wait_for("echo: next question")
            chat.type("\x04")  # Ctrl-D
            assert await chat.exit_code() == 0, chat.screen
    screen = chat.screen
    assert "membot › alpha beta gamma delta epsilon zeta\n" in screen, screen
    answer_shown = screen.index("membot › alpha beta gamma delta epsilon zeta")
    assert screen.index("you › next question", answer_shown) < screen.index("membot › echo: next question")
    assert chat_requests(llm) == ["hi", "next question"]


async def test_a_line_longer_than_the_terminal_line_limit_reaches_the_model_whole(tmp_path: Path) -> None:
    """The kernel's line mode passes on at most 4,095 bytes of a line (1,024 on macOS): a 5,000-character
    paragraph was cut (and then refused with a note). The line editor reads keys, not lines."""
    long_line = "y" * 5000 + " END"
    async with FakeLLMServer() as llm, membot_chat_on_a_terminal(tmp_path, llm) as chat:
        await chat.wait_for("you ›")
        await chat.type_all(long_line + "\r")
        await chat.wait_for(" END\n", timeout=60)
        await chat.wait_for("echo: y")
        chat.type("\x04")
        assert await chat.exit_code() == 0, chat.screen
    assert chat_requests(llm) == [long_line]


async def test_ctrl_c_stops_the_answer_then_quits_at_the_prompt(tmp_path: Path) -> None:
    """The line editor reads Ctrl-C as a key (the kernel no longer turns it into SIGINT): it still
    stops the answer being written, and at the prompt it ends the chat."""
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="a very slow answer", delay=30))
        async with membot_chat_on_a_terminal(tmp_path, llm) as chat:
            await chat.wait_for("you ›")
            chat.type("think hard\r")
            await wait_in_flight(llm)
            chat.type("\x03")  # Ctrl-C
            await chat.wait_for("[stopped]")
            chat.type("\x03")
            assert await chat.exit_code() == 0, chat.screen
    assert "a very slow answer" not in chat.screen
    assert "bye — the conversation is saved." in chat.screen


async def test_the_up_arrow_brings_back_a_message_sent_in_an_earlier_chat(tmp_path: Path) -> None:
    """History across runs, in a file as private as the sessions (it holds what the user typed)."""
    async with FakeLLMServer() as llm:
        async with membot_chat_on_a_terminal(tmp_path, llm) as chat:
            await chat.wait_for("you ›")
            chat.type("remember\nthis\x1b[200~pasted\nlines\x1b[201~\r")  # (a bracketed paste in it)
            await chat.wait_for("echo: remember")
            chat.type("\x04")
            assert await chat.exit_code() == 0, chat.screen
        async with membot_chat_on_a_terminal(tmp_path, llm) as chat:
            await chat.wait_for("you ›")
            chat.type("\x1b[A\r")  # up, Enter
            await chat.wait_for("echo: remember")
            chat.type("\x04")
            assert await chat.exit_code() == 0, chat.screen
    assert chat_requests(llm) == ["remember\nthispasted\nlines"] * 2
    [history] = (tmp_path / "ws" / "state" / "terminal_history").iterdir()
    assert history.name == "ana.jsonl"
    assert history.stat().st_mode & 0o777 == 0o600
    assert history.parent.stat().st_mode & 0o777 == 0o700


async def test_ctrl_d_typed_while_a_full_disk_holds_a_message_back_ends_the_chat_once_it_is_stored(
    tmp_path: Path,
) -> None:
    """Between two inputs the terminal was back in the kernel's line mode, for as long as a full disk
    held the message back: keys typed then were echoed onto the screen, and a Ctrl-D became an end of
    input that the next input line (raw mode) never saw, so the chat did not end."""
    async with FakeLLMServer() as llm, membot_chat_on_a_terminal(tmp_path, llm) as chat:
        await chat.wait_for("you ›")
        repair = break_folder(tmp_path / "ws" / "inbox")  # every inbox write fails, as on a full disk
        chat.type("held back\r")
        await chat.wait_for("I can't save your message right now")
        chat.type("\x04")  # Ctrl-D
        repair()
        assert await chat.exit_code() == 0, chat.screen
    assert chat_requests(llm) == ["held back"]


async def test_a_second_sigterm_exits_at_once_with_the_terminal_back_in_line_mode(tmp_path: Path) -> None:
    """The chat holds the terminal in raw mode; a second signal exits at once (os._exit, no Python code
    after it), which left the terminal raw: the shell then showed nothing typed and Enter ran nothing
    visible, until the user typed ``reset`` blind."""
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="never finished", delay=30))
        async with membot_chat_on_a_terminal(tmp_path, llm) as chat:
            line_mode = termios.ICANON | termios.ECHO  # as a new terminal is (os.openpty)
            await chat.wait_for("you ›")
            chat.type("think hard\r")
            await wait_in_flight(llm)
            assert not termios.tcgetattr(chat.master)[3] & termios.ICANON  # raw while the chat runs
            chat.process.send_signal(signal.SIGTERM)  # the grace period: the answer may still finish
            await _logged(tmp_path / "ws" / "logs" / "chat.log", "graceful shutdown")
            chat.process.send_signal(signal.SIGTERM)
            assert await chat.exit_code() == 128 + signal.SIGTERM, chat.screen
            assert termios.tcgetattr(chat.master)[3] & line_mode == line_mode


async def _logged(log: Path, text: str) -> None:
    """Until membot chat's log holds ``text``."""
    async with asyncio.timeout(30):
        while text not in await asyncio.to_thread(log.read_text):
            await asyncio.sleep(0.02)


async def test_ctrl_c_after_ctrl_d_quits_while_a_full_disk_still_holds_a_message_back(tmp_path: Path) -> None:
    """After Ctrl-D the chat waits for the held message to be stored, with no input line any more: the
    terminal stayed in raw mode, so Ctrl-C was a key nobody read, and only a kill from elsewhere ended
    the chat. The notice says quitting loses the message; quitting must then be possible."""
    async with FakeLLMServer() as llm, membot_chat_on_a_terminal(tmp_path, llm) as chat:
        await chat.wait_for("you ›")
        repair = break_folder(tmp_path / "ws" / "inbox")  # every inbox write fails, as on a full disk
        try:
            chat.type("held back\r")
            await chat.wait_for("I can't save your message right now")
            chat.type("\x04")  # Ctrl-D
            await _in_line_mode(chat)  # (no input line reads keys now: the kernel's line mode does)
            chat.type("\x03")  # Ctrl-C
            assert await chat.exit_code(timeout=10) == 0, chat.screen
        finally:
            repair()
    assert chat_requests(llm) == []


async def _in_line_mode(chat: TerminalChat) -> None:
    """Until membot puts the terminal back in the kernel's line mode."""
    async with asyncio.timeout(30):
        while not termios.tcgetattr(chat.master)[3] & termios.ICANON:
            await asyncio.sleep(0.02)
