"""``membot chat`` as a person uses it: a real process, Ctrl-C (SIGINT) mid-answer and at the prompt."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from bot.sessions import JsonSessionStore
from tests.bot.cli.membot_process import wait_in_flight
from tests.fakes.llm_server import FakeLLMServer, FakeReply


class Chat:
    """A running ``membot chat``: we type into its stdin and read what it prints."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.out = ""
        self.err = ""
        self._readers = [
            asyncio.create_task(self._collect(process.stdout, "out")),
            asyncio.create_task(self._collect(process.stderr, "err")),
        ]

    async def _collect(self, stream: asyncio.StreamReader | None, into: str) -> None:
        assert stream is not None
        while chunk := await stream.read(1024):
            setattr(self, into, getattr(self, into) + chunk.decode("utf-8", "replace"))

    async def type(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((line + "\n").encode())
        await self.process.stdin.drain()

    async def wait_for(self, text: str, timeout: float = 90) -> None:
        """Until ``text`` is shown. A generous limit: on a loaded machine a process's start alone has
        taken 30 s; what timed out then says what the chat showed instead."""
        try:
            async with asyncio.timeout(timeout):
                while text not in self.out:
                    assert self.process.returncode is None, f"membot chat exited:\n{self.out}\n{self.err}"
                    await asyncio.sleep(0.02)
        except TimeoutError:
            raise AssertionError(f"not shown in {timeout:g} s: {text!r}\n{self.out}\n{self.err}") from None

    async def exit_code(self, timeout: float = 30) -> int:
        async with asyncio.timeout(timeout):
            code = await self.process.wait()
            await asyncio.gather(*self._readers)
        return code


@contextlib.asynccontextmanager
async def membot_chat(home: Path, llm: FakeLLMServer, **settings: str) -> AsyncIterator[Chat]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBOT_")}
    env.update(
        HOME=str(home),
        MEMBOT_WORKSPACE=str(home / "ws"),
        MEMBOT_LLM__OPENAI__BASE_URL=llm.openai_base_url,
        MEMBOT_LLM__OPENAI__API_KEY="sk-test-key-123456",
        MEMBOT_TERMINAL__USER="ana",
    )
    env.update(settings)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        "chat",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=home,
    )
    chat = Chat(process)
    try:
        await chat.wait_for("Ctrl-D to quit")
        yield chat
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_ctrl_c_stops_the_answer_then_quits_at_the_prompt_and_the_chat_continues_later(
    tmp_path: Path,
) -> None:
    # Strict chat templates (local servers) refuse the two user messages in a row a stop leaves behind.
    async with FakeLLMServer(strict_template=True) as llm:
        llm.script(FakeReply(text="a very slow answer", delay=30))
        async with membot_chat(tmp_path, llm) as chat:
            await chat.type("think hard about this")
            await wait_in_flight(llm)
            chat.process.send_signal(signal.SIGINT)  # Ctrl-C while the answer is being written
            await chat.wait_for("[stopped]")
            assert chat.process.returncode is None  # still chatting
            await chat.type("and now?")
            # The unanswered question and this one reach the model as one user turn.
            await chat.wait_for("echo: think hard about this\n\nand now?\nyou › ")  # the whole reply
            chat.process.send_signal(signal.SIGINT)  # Ctrl-C at the prompt quits
            assert await chat.exit_code() == 0, chat.err
        assert "a very slow answer" not in chat.out
        assert "bye — the conversation is saved." in chat.out

        store = JsonSessionStore(tmp_path / "ws" / "sessions")
        session = await store.load("cli:ana")
        assert session is not None
        assert [m.content for m in session.messages if m.role.value == "user"] == [
            "think hard about this",
            "and now?",
        ]

        async with membot_chat(tmp_path, llm) as chat:  # a new process continues the conversation
            await chat.type("still there?")
            await chat.wait_for("echo: still there?")
            assert chat.process.stdin is not None
            chat.process.stdin.close()  # Ctrl-D
            assert await chat.exit_code() == 0, chat.err
        sent = [m["content"] for m in llm.requests[-1].body["messages"] if m["role"] == "user"]
        assert sent[-2:] == ["think hard about this\n\nand now?", "still there?"]


async def test_a_lone_surrogate_in_an_answer_does_not_break_the_chat(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm:
        # "\ud800" travels as the JSON escape \ud800: valid JSON, but no UTF-8 file can hold it.
        llm.script(FakeReply(text="broken \ud800 answer"))
        async with membot_chat(tmp_path, llm) as chat:
            await chat.type("hello")
            await chat.wait_for("broken \ufffd answer")
            await chat.type("still saving?")
            await chat.wait_for("echo: still saving?\nyou › ")
            assert chat.process.stdin is not None
            chat.process.stdin.close()
            assert await chat.exit_code() == 0, chat.err
        session = await JsonSessionStore(tmp_path / "ws" / "sessions").load("cli:ana")
        assert session is not None
        assert [m.content for m in session.messages] == [
            "hello",
            "broken \ufffd answer",
            "still saving?",
            "echo: still saving?",
        ]


async def test_a_line_longer_than_64_kib_is_answered(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm, membot_chat(tmp_path, llm) as chat:
        await chat.type("x" * 100_000)  # a big paste on one line
        await chat.wait_for("[message truncated: 100000 characters, limit 16000]")
        await chat.type("and after it?")
        await chat.wait_for("echo: and after it?")
        assert chat.process.stdin is not None
        chat.process.stdin.close()
        assert await chat.exit_code() == 0, chat.err


async def test_an_unreachable_model_is_one_plain_line_and_the_details_go_to_the_log(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm:
        unreachable = "http://bob:hunter2-secret@127.0.0.1:9/v1"  # a proxy password in the URL
        async with membot_chat(
            tmp_path,
            llm,
            MEMBOT_LLM__OPENAI__BASE_URL=unreachable,
            MEMBOT_LLM__MAX_RETRIES="0",
            MEMBOT_DISPATCHER__MODEL_RETRY_MAX_AGE="0",  # told at once (bot/model_wait.py: not waited for)
        ) as chat:
            await chat.type("hello?")
            await chat.wait_for("send another message to try again.\nyou › ")
            assert chat.process.stdin is not None
            chat.process.stdin.close()
            assert await chat.exit_code() == 0, chat.err
    screen = chat.out + chat.err
    [reply] = [line for line in screen.splitlines() if "membot ›" in line]
    assert "the AI model cannot be reached right now" in reply
    for internal in ("Traceback", "127.0.0.1:9", "hunter2", "MEMBOT_", "LLMUnavailable", "base_url"):
        assert internal not in screen, internal
    log = (tmp_path / "ws" / "logs" / "chat.log").read_text()
    assert "llm_failed" in log and "LLMUnavailable" in log and "127.0.0.1:9" in log  # one line, no traceback
    assert "Traceback" not in log
    assert "hunter2" not in log


async def test_input_that_ends_while_the_model_is_waited_for_ends_the_chat_and_the_next_start_answers(
    tmp_path: Path,
) -> None:
    """``echo hi | membot chat`` (or Ctrl-D) with the model down: the chat waited for the model's
    return, up to ``dispatcher.model_retry_max_age`` (an hour), silent, and Ctrl-C did not end it. The
    question stays pending and the next start shows and answers it, as after any other stop."""
    async with FakeLLMServer() as llm:
        async with membot_chat(
            tmp_path, llm, MEMBOT_LLM__OPENAI__BASE_URL="http://127.0.0.1:9/v1", MEMBOT_LLM__MAX_RETRIES="0"
        ) as chat:
            await chat.type("are you there?")
            await chat.wait_for("I can't reach the AI model right now")
            assert chat.process.stdin is not None
            chat.process.stdin.close()
            assert await chat.exit_code(timeout=15) == 0, chat.out + chat.err
        assert "bye — the conversation is saved." in chat.out
        async with membot_chat(tmp_path, llm) as chat:
            await chat.wait_for("echo: are you there?")
            assert "membot stopped before it answered:\n  you › are you there?" in chat.out


async def test_a_key_the_provider_echoes_reaches_neither_the_chat_nor_the_log(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm:
        echoed = {"error": {"message": "Incorrect API key provided: local-key-0123456789abc.", "type": "x"}}
        llm.script(FakeReply(status=401, error=echoed))
        async with membot_chat(tmp_path, llm, MEMBOT_LLM__OPENAI__API_KEY="local-key-0123456789abc") as chat:
            await chat.type("hello?")
            await chat.wait_for("send another message to try again.\nyou › ")
            assert chat.process.stdin is not None
            chat.process.stdin.close()
            assert await chat.exit_code() == 0, chat.err
    assert "refused the bot's access" in chat.out
    assert "local-key" not in chat.out + chat.err and "MEMBOT_" not in chat.out
    log = (tmp_path / "ws" / "logs" / "chat.log").read_text()
    assert "LLMAuthError" in log and "local-key" not in log


async def test_usage_counts_every_call_the_provider_bills(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm:
        async with membot_chat(tmp_path, llm, MEMBOT_TIMEZONE="UTC") as chat:
            for line in ("one", "two", "three"):
                await chat.type(line)
                await chat.wait_for(f"echo: {line}\nyou › ")
            await chat.type("/compact 2")
            await chat.wait_for("Compacted")
            await chat.type("/new")
            await chat.wait_for("Session cleared.")
            await chat.type("/status")
            await chat.wait_for("Uptime:")
            assert chat.process.stdin is not None
            chat.process.stdin.close()
            assert await chat.exit_code() == 0, chat.err
        billed = len(llm.requests)
    [day] = json.loads((tmp_path / "ws" / "usage.json").read_text())["days"].values()
    assert day["calls"] == billed
    assert {k: v["calls"] for k, v in day["purposes"].items()} == {
        "chat": 3,
        "compaction": 1,
        "consolidation": billed - 4,
    }
    assert f"· {billed} calls" in chat.out and "by use: chat 3 calls" in chat.out


async def test_after_compact_a_strict_chat_template_still_accepts_every_request(tmp_path: Path) -> None:
    async with FakeLLMServer(strict_template=True) as llm:
        async with membot_chat(tmp_path, llm) as chat:
            for line in ("one", "two", "three"):
                await chat.type(line)
                await chat.wait_for(f"echo: {line}\nyou › ")
            await chat.type("/compact 1")
            await chat.wait_for("Compacted")
            await chat.type("after the summary")
            await chat.wait_for("echo: after the summary\nyou › ")
            assert chat.process.stdin is not None
            chat.process.stdin.close()
            assert await chat.exit_code() == 0, chat.err
        assert "Sorry" not in chat.out
        last = llm.requests[-1].body["messages"]
        assert [m["role"] for m in last][:2] == ["system", "user"]
        assert sum(m["role"] == "system" for m in last) == 1
        assert "[Conversation summary]" in last[0]["content"]  # folded into the one system prompt


async def test_input_that_ends_while_answers_are_coming_gets_them_first(tmp_path: Path) -> None:
    """``printf 'hi\\n/status\\nmore\\n' | membot chat``: the input ends at once; every answer is printed
    before "bye" (collect mode joins messages, so there are fewer answers than lines)."""
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="first answer", delay=0.5))
        async with membot_chat(tmp_path, llm) as chat:
            for line in ("hi", "/status", "more", "and more"):
                await chat.type(line)
            assert chat.process.stdin is not None
            chat.process.stdin.close()
            assert await chat.exit_code() == 0, chat.err
    answers = chat.out.split("bye — the conversation is saved.")[0]
    assert "first answer" in answers and "echo: more\n\nand more" in answers and "Uptime:" in answers


async def membot_chat_reading(home: Path, llm: FakeLLMServer, stdin: Path) -> tuple[int, str, str]:
    """``membot chat < FILE``: runs to the end of the file; returns the exit code, stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBOT_")}
    env.update(
        HOME=str(home),
        MEMBOT_WORKSPACE=str(home / "ws"),
        MEMBOT_LLM__OPENAI__BASE_URL=llm.openai_base_url,
        MEMBOT_LLM__OPENAI__API_KEY="sk-test-key-123456",
    )
    with stdin.open("rb") as source:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot",
            "chat",
            stdin=source,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=home,
        )
    try:
        async with asyncio.timeout(30):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_input_from_a_file_is_answered_in_order_then_the_chat_ends(tmp_path: Path) -> None:
    """``membot chat < questions.txt``: a regular file cannot be watched like a pipe or a terminal (it
    stopped the chat with a ValueError before the first line)."""
    questions = tmp_path / "questions.txt"
    questions.write_text("first\nsecond\nthird\n")
    async with FakeLLMServer(strict_template=True) as llm:
        code, out, err = await membot_chat_reading(tmp_path, llm, questions)
    assert code == 0, out + err
    answers = out.split("bye — the conversation is saved.")[0]
    assert "echo: first" in answers and "third" in answers  # collect mode may join the queued lines
    assert answers.index("echo: first") < answers.index("second") < answers.index("third")


async def test_input_from_dev_null_ends_the_chat_at_once(tmp_path: Path) -> None:
    """``membot chat < /dev/null`` (cron, nohup, a service without a terminal): the input is over before
    it starts, so the chat says bye and exits 0 (epoll refuses /dev/null, and the chat waited forever)."""
    async with FakeLLMServer() as llm:
        code, out, err = await membot_chat_reading(tmp_path, llm, Path(os.devnull))
    assert code == 0, out + err
    assert "bye — the conversation is saved." in out


async def test_control_sequences_in_an_answer_are_shown_not_obeyed(tmp_path: Path) -> None:
    """An answer is text to read: ESC sequences from the model (or a page it quotes) retitled the
    window, cleared the screen and wrote the clipboard (OSC 52), and \\r or \\b hid what came before."""
    evil = (
        "title \x1b]0;PWNED\x07 clear \x1b[2J\x1b[31mred\x1b[0m clip \x1b]52;c;cm0gLXJmIH4=\x07"
        " csi \x9b2J back\x08\x08 rm -rf ~\rls\r\nnext line\tend"
    )
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text=evil))
        async with membot_chat(tmp_path, llm) as chat:
            await chat.type("hello")
            await chat.wait_for("end\nyou › ")
            assert chat.process.stdin is not None
            chat.process.stdin.close()
            assert await chat.exit_code() == 0, chat.err
    answer = chat.out.split("membot › ", 1)[1].split("\nyou › ", 1)[0]
    for control in ("\x1b", "\x07", "\x9b", "\x08", "\r"):
        assert control not in answer, repr(answer)
    assert "]0;PWNED" in answer and "rm -rf ~" in answer and "next line\tend" in answer  # all still shown
    session = await JsonSessionStore(tmp_path / "ws" / "sessions").load("cli:ana")
    assert session is not None and session.messages[-1].content == evil  # kept as the model wrote it


async def test_after_a_kill_the_next_chat_shows_the_question_it_answers_once(tmp_path: Path) -> None:
    """SIGKILL mid-answer: the next start answers the question once, and first shows it, since the new
    terminal does not show what was typed."""
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="never finished", delay=30))
        async with membot_chat(tmp_path, llm) as chat:
            await chat.type("what was the \x1b[31mquestion?")
            await wait_in_flight(llm)
            chat.process.kill()
            await chat.exit_code()
        llm.script(FakeReply(text="the answer"))
        async with membot_chat(tmp_path, llm) as chat:
            await chat.wait_for("membot › the answer\nyou › ")
            assert chat.process.stdin is not None
            chat.process.stdin.close()
            assert await chat.exit_code() == 0, chat.err
    before, after = chat.out.split("membot › the answer")
    assert "what was the ␛[31mquestion?" in before  # shown, not obeyed
    assert "question?" not in after and after.count("membot ›") == 0
    assert len(llm.requests) == 2


async def test_sigterm_mid_answer_ends_the_chat_gracefully_and_the_next_start_answers(tmp_path: Path) -> None:
    """SIGTERM (``kill``, a logout, systemd) ended ``membot chat`` as a kill does: exit -15, no "bye". It
    now stops as ``membot run`` does: the answer gets the grace period, then is cut short; exit 0."""
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="never finished", delay=30))
        async with membot_chat(tmp_path, llm, MEMBOT_LIFECYCLE__GRACE_PERIOD="0.5") as chat:
            await chat.type("what was the question?")
            await wait_in_flight(llm)
            chat.process.send_signal(signal.SIGTERM)
            assert await chat.exit_code(timeout=10) == 0, chat.err
        assert "bye — the conversation is saved." in chat.out and "never finished" not in chat.out
        llm.script(FakeReply(text="the answer"))
        async with membot_chat(tmp_path, llm) as chat:
            await chat.wait_for("membot › the answer\nyou › ")
            assert chat.process.stdin is not None
            chat.process.stdin.close()
            assert await chat.exit_code() == 0, chat.err
    assert "membot stopped before it answered:\n  you › what was the question?" in chat.out
    assert len(llm.requests) == 2


async def test_a_second_sigterm_while_the_answer_gets_its_grace_period_exits_at_once(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="never finished", delay=30))
        async with membot_chat(tmp_path, llm) as chat:  # the default grace period: 20 s
            await chat.type("think hard")
            await wait_in_flight(llm)
            chat.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            assert chat.process.returncode is None  # the answer has its grace period
            chat.process.send_signal(signal.SIGTERM)
            assert await chat.exit_code(timeout=10) == 128 + signal.SIGTERM


async def test_ctrl_c_twice_mid_answer_stops_it_once(tmp_path: Path) -> None:
    """An impatient double Ctrl-C: one stop, one "[stopped]" (each press started a stop of its own and
    every notice was printed twice); what was typed still reaches the model with the next message."""
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="a very slow answer", delay=30))
        async with membot_chat(tmp_path, llm) as chat:
            await chat.type("think hard")
            await chat.type("typed ahead")
            await wait_in_flight(llm)
            chat.process.send_signal(signal.SIGINT)
            chat.process.send_signal(signal.SIGINT)
            await chat.wait_for("[stopped]\nyou › ")
            await asyncio.sleep(0.5)
            assert chat.out.count("[stopping the answer") == 1 and chat.out.count("[stopped]") == 1
            await chat.type("and now?")
            await chat.wait_for("and now?\nyou › ")
            assert chat.process.stdin is not None
            chat.process.stdin.close()
            assert await chat.exit_code() == 0, chat.err
    sent = [m["content"] for m in llm.requests[-1].body["messages"] if m["role"] == "user"]
    assert "think hard" in sent[-1] and "typed ahead" in sent[-1] and "and now?" in sent[-1]


async def test_a_command_typed_while_an_answer_streams_does_not_print_the_answer_again(
    tmp_path: Path,
) -> None:
    """``/status`` mid-answer is answered at once, on a line of its own; the answer then goes on where it
    was (it started over, so its beginning was on the screen twice)."""
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="alpha beta gamma delta epsilon zeta", stall_after=3, stall=2))
        async with membot_chat(tmp_path, llm) as chat:
            await chat.type("hi")
            await chat.wait_for("membot › alpha")
            await chat.type("/status")
            await chat.wait_for("zeta\nyou › ")
            await asyncio.sleep(0.5)
            assert chat.process.stdin is not None
            chat.process.stdin.close()
            assert await chat.exit_code() == 0, chat.err
    assert chat.out.count("alpha") == 1 and chat.out.count("zeta") == 1, chat.out
    assert chat.out.index("alpha") < chat.out.index("Uptime:") < chat.out.index("zeta")


async def test_a_chat_killed_after_its_tool_ran_does_not_run_it_again_at_the_next_start(
    tmp_path: Path,
) -> None:
    """The terminal's turns are recorded like a platform's: answered again after a kill, the turn that
    asks for the same tool call gets the result the first run recorded; the note is appended once."""
    append = ("files", {"action": "append", "path": "notes/shopping.md", "content": "- milk"})
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(tool_calls=[append]), FakeReply(text="never finished", delay=30))
        async with membot_chat(tmp_path, llm) as chat:
            await chat.type("add milk to my shopping list")
            async with asyncio.timeout(30):
                while len(llm.requests) < 2 or not llm.in_flight:  # the tool ran; the model answers
                    await asyncio.sleep(0.01)
            chat.process.kill()
            await chat.exit_code()
        llm.script(FakeReply(tool_calls=[append]), FakeReply(text="Added."))
        async with membot_chat(tmp_path, llm) as chat:
            await chat.wait_for("membot › Added.\nyou › ")
            assert chat.process.stdin is not None
            chat.process.stdin.close()
            assert await chat.exit_code() == 0, chat.err
        tool_results = [m for m in llm.requests[-1].body["messages"] if m["role"] == "tool"]
    assert (tmp_path / "ws" / "notes" / "shopping.md").read_text() == "- milk"  # (twice: "- milk- milk")
    assert len(tool_results) == 1 and "notes/shopping.md" in tool_results[0]["content"]
