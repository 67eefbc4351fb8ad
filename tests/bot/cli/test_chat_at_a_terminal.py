"""``membot chat`` at a real terminal: the process runs on a pseudo-terminal, as under a terminal window.

The terminal is in its usual canonical mode, so the kernel echoes what is typed and hands membot one
line per read, as a terminal emulator's paste does (it writes the whole text to the terminal at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from tests.bot.cli.membot_process import wait_in_flight
from tests.fakes.llm_server import FakeLLMServer, FakeReply

# The child makes the pseudo-terminal its controlling terminal, as a login shell's is, then becomes
# membot: closing the terminal (its master side) then sends it SIGHUP, as closing a window does.
_ON_A_TERMINAL = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, [sys.executable, '-m', 'bot', 'chat'])"
)


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
        self._screen += chunk

    @property
    def screen(self) -> str:
        return self._screen.decode("utf-8", "replace").replace("\r\n", "\n")

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    async def wait_for(self, text: str, timeout: float = 30) -> None:
        async with asyncio.timeout(timeout):
            while text not in self.screen:
                assert self.process.returncode is None, f"membot chat exited:\n{self.screen}"
                await asyncio.sleep(0.02)

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
        await chat.wait_for("print(total([1, 2, None, 3]))\nyou › ")
        assert chat_requests(llm) == ["\n".join(SNIPPET)]

        chat.type("first\n")
        await asyncio.sleep(0.3)
        chat.type("second\n")
        await chat.wait_for("echo: second\nyou › ")
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
            await chat.wait_for("membot › the answer\nyou › ")
            chat.type("\x04")
            assert await chat.exit_code() == 0, chat.screen
    assert "membot stopped before it answered:\n  you › what was the question?" in chat.screen
    assert chat_requests(llm) == ["what was the question?"] * 2


async def test_a_line_sent_with_ctrl_d_is_answered_below_it_not_over_it(tmp_path: Path) -> None:
    """Ctrl-D mid-line hands the line over without an Enter, so the cursor stays after the typed text:
    the reply's "\\rmembot › Paris" wrote over the question ("membot › Parisapital of France")."""
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="Paris"))
        async with membot_chat_on_a_terminal(tmp_path, llm) as chat:
            await chat.wait_for("you › ")
            chat.type("what is the capital of France\x04\x04")  # the first sends the line, the second quits
            assert await chat.exit_code() == 0, chat.screen
    # As after an Enter: the line ends, and the reply starts on the next one.
    assert "you › what is the capital of France\n\rmembot › Paris\n" in chat.screen
    assert chat_requests(llm) == ["what is the capital of France"]


async def test_a_line_the_terminal_cut_is_not_sent_as_if_whole_and_the_user_is_told(tmp_path: Path) -> None:
    """A terminal passes on only the first 4,095 bytes of a line (the screen still echoes all of it):
    a 5,000-character paragraph reached the model without its end, "END" included, and no one knew."""
    async with FakeLLMServer() as llm, membot_chat_on_a_terminal(tmp_path, llm) as chat:
        await chat.wait_for("you › ")
        chat.type("y" * 5000 + " END\n")
        await chat.wait_for("Not sent: a line of that message was cut by the terminal")
        chat.type("a short one\n")
        await chat.wait_for("echo: a short one\nyou › ")
        chat.type("\x04")
        assert await chat.exit_code() == 0, chat.screen
    assert chat_requests(llm) == ["a short one"]
