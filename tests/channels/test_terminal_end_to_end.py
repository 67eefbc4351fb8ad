"""End to end: terminal channel → dispatcher → pipeline → fake LLM (HTTP) → reply → disk → restart."""

from __future__ import annotations

import asyncio
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from bot.app import build_core
from bot.config import Settings, load_settings
from bot.domain import InboundMessage, OutboundMessage
from channels.terminal import TerminalChannel
from tests.channels.telegram.kit import break_folder
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.llm_wire import AZURE_FILTERED


async def settings_for(
    workspace: Path, llm: FakeLLMServer, *, llm_extra: dict[str, Any] | None = None, **extra: Any
) -> Settings:
    overrides: dict[str, Any] = {
        "workspace": workspace,
        "llm": {
            "model": "gpt-4.1-mini",
            "openai": {"base_url": llm.openai_base_url, "api_key": "sk-test-key-123456"},
            **(llm_extra or {}),
        },
    }
    overrides.update(extra)
    return await asyncio.to_thread(load_settings, None, env_file=None, overrides=overrides)


class Screen(io.StringIO):
    async def wait_for(self, text: str, timeout: float = 10.0) -> str:
        async with asyncio.timeout(timeout):
            while text not in self.getvalue():
                await asyncio.sleep(0.01)
        return self.getvalue()


async def chat_once(settings: Settings, lines: list[str], expect: str) -> str:
    reader = asyncio.StreamReader()
    screen = Screen()
    async with build_core(settings) as core:
        channel = TerminalChannel(core.dispatcher.submit, user="alice", reader=reader, writer=screen)
        core.dispatcher.attach(channel)
        await channel.start()
        for line in lines:
            reader.feed_data((line + "\n").encode())
        out = await screen.wait_for(expect)
        reader.feed_eof()
        await channel.wait_closed()
        await channel.stop()
    return out


async def test_conversation_survives_a_restart(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm:
        settings = await settings_for(tmp_path / "ws", llm)
        out = await chat_once(settings, ["my name is Alice"], "echo: my name is Alice")
        assert "membot › echo: my name is Alice" in out

        header = json.loads((tmp_path / "ws" / "sessions" / "cli:alice.json").read_text())
        assert header["log_count"] == 2

        # A new process: fresh objects over the same workspace. The model must see the old turn.
        await chat_once(settings, ["what is my name?"], "echo: what is my name?")
        last = llm.requests[-1]
        contents = [m.get("content") for m in last.body["messages"]]
        assert "my name is Alice" in json.dumps(contents)
        assert "echo: my name is Alice" in json.dumps(contents)


async def test_help_is_answered_without_the_model(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm:
        out = await chat_once(await settings_for(tmp_path / "ws", llm), ["/help"], "/stop")
        assert "Commands:" in out
        assert llm.requests == []


async def test_help_in_the_terminal_lists_quit_and_exit(tmp_path: Path) -> None:
    """The terminal ends the chat on /quit or /exit itself, but /help did not say so: a user there had
    only Ctrl-D to find. (Telegram's /help does not list them: tests/channels/telegram/test_end_to_end.py.)"""
    async with FakeLLMServer() as llm:
        out = await chat_once(await settings_for(tmp_path / "ws", llm), ["/help"], "/quit")
        assert "/quit — End the chat (/exit too)" in out and "/stop" in out
        assert llm.requests == []


async def test_status_reports_what_memory_gave_the_last_reply(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm:
        settings = await settings_for(tmp_path / "ws", llm)
        reader, screen = asyncio.StreamReader(), Screen()
        async with build_core(settings) as core:
            channel = TerminalChannel(core.dispatcher.submit, user="alice", reader=reader, writer=screen)
            core.dispatcher.attach(channel)
            await channel.start()
            for line, expect in [
                ("/status", "Uptime:"),
                ("I drink green tea every morning", "echo: I drink green tea"),
                ("/new", "Session cleared."),  # a fresh conversation: the fact now comes from memory
                ("which tea do I drink in the morning?", "echo: which tea"),
                ("/status", "Last recall:"),
            ]:
                reader.feed_data((line + "\n").encode())
                await screen.wait_for(expect)
            await screen.wait_for(" ms\n")
            reader.feed_eof()
            await channel.wait_closed()
            await channel.stop()
        out = screen.getvalue()
        first = out.split("Uptime:")[0]
        assert "Last recall" not in first  # nothing recalled yet in this process
        recall = next(line for line in out.splitlines() if "Last recall:" in line)
        assert re.search(
            r"Last recall: [1-9]\d* memories from [1-9]\d* match(es)?(, with the turns around them)? \(\d+ of your ",
            recall,
        ), recall
        assert re.search(r"· \d+ / 2\.8k tokens · [\d.]+ ms$", recall), recall
        # ...and what reached the model is that memory: the fact from the first turn.
        assert "green tea every morning" in json.dumps(llm.requests[-1].body["messages"][0])


async def test_status_says_memory_is_off_when_it_is(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm:
        settings = await settings_for(tmp_path / "ws", llm, memory={"enabled": False})
        out = await chat_once(settings, ["/status"], "Uptime:")
        assert "Memory: off" in out and "MEMORY.md" not in out


async def test_with_a_server_of_ones_own_summaries_ask_for_its_model(tmp_path: Path) -> None:
    """A local server (Ollama) was asked for the catalog's gpt-4.1-mini to summarize: every compaction
    failed and fell back to cutting the history."""
    async with FakeLLMServer() as llm:
        settings = await settings_for(tmp_path / "ws", llm)
        settings = settings.model_copy(update={"llm": settings.llm.model_copy(update={"model": "llama3.1"})})
        lines = ["first fact", "second fact", "third fact", "/compact 1"]
        out = await chat_once(settings, lines, "Compacted")
    assert "No summary" not in out
    assert {r.body["model"] for r in llm.requests} == {"llama3.1"}


async def test_a_command_reply_between_a_streamed_answer_and_its_end_does_not_print_it_twice() -> None:
    """The stream showed the whole answer, then a ``/status`` reply came before the turn had saved and
    sent it: the answer was printed a second time, whole."""
    screen = Screen()

    async def nobody_types(message: InboundMessage) -> None:
        raise AssertionError(message)

    channel = TerminalChannel(nobody_types, user="alice", reader=asyncio.StreamReader(), writer=screen)
    show = channel.partial_sink("alice")
    assert show is not None
    await show("the whole answer")
    await channel.send(OutboundMessage("cli", "alice", "Uptime: 0s", aside=True))
    await channel.send(OutboundMessage("cli", "alice", "the whole answer"))
    await channel.send(OutboundMessage("cli", "alice", "next"))
    assert screen.getvalue() == (
        "\rmembot › the whole answer\nmembot › Uptime: 0s\nyou › membot › next\nyou › "
    )


def user_turns(llm: FakeLLMServer) -> list[str]:
    """The last user message of each request the model got: one per turn that asked it."""
    return [[m["content"] for m in r.body["messages"] if m["role"] == "user"][-1] for r in llm.requests]


async def test_a_line_typed_while_the_disk_refuses_it_is_kept_and_answered_once_storage_returns(
    tmp_path: Path,
) -> None:
    """The terminal has no platform to send a line again: one the inbox could not store is held and
    handed over again until it can be, the user told once meanwhile; what is typed after it (a line, the
    end of input) waits behind it and is then taken in order, as README says (its read loop died with the
    write's error: the line was lost, and nothing typed after it was read)."""
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm:
        settings = await settings_for(workspace, llm)
        reader, screen = asyncio.StreamReader(), Screen()
        async with build_core(settings) as core:
            channel = TerminalChannel(core.dispatcher.submit, user="alice", reader=reader, writer=screen)
            core.dispatcher.attach(channel)
            await channel.start()
            reader.feed_data(b"before the outage\n")
            await screen.wait_for("echo: before the outage")
            repair = break_folder(workspace / "inbox")  # every inbox write fails, as on a full disk
            reader.feed_data(b"typed on a full disk\n")
            await screen.wait_for("I can't save your message right now")
            reader.feed_data(b"typed after it\n")
            reader.feed_eof()
            repair()
            await channel.wait_closed()  # the end of input, read once both lines were taken in
            await core.dispatcher.settled(channel.session_id)
            await channel.stop()
    assert screen.getvalue().count("I can't save your message right now") == 1  # told once, not per try
    first, *later = user_turns(llm)
    asked = "\n".join(later)  # (the two may be answered in one turn: the dispatcher's collect mode)
    assert first == "before the outage" and asked.count("typed on a full disk") == 1
    assert asked.count("typed after it") == 1
    assert asked.index("typed on a full disk") < asked.index("typed after it")


async def test_an_answer_the_content_filter_declined_is_one_warning_not_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Azure's content filter declining a prompt (400 ``content_filter``) is an expected, classified
    refusal: it went through ``system_failed`` with a full traceback, as if membot had a bug."""
    async with FakeLLMServer() as llm:
        llm.responder = lambda api, body: FakeReply(status=400, error=AZURE_FILTERED)
        settings = await settings_for(tmp_path / "ws", llm)
        out = await chat_once(settings, ["something the filter flags"], "content filter declined")
    assert "the AI provider's content filter declined this request" in out
    events = [r for r in caplog.records if isinstance(r.msg, dict)]
    assert [r.msg["system"] for r in events if r.msg["event"] == "system_failed"] == []
    [declined] = [r for r in events if r.msg["event"] == "llm_content_filtered"]
    assert declined.levelname == "WARNING" and not declined.exc_info and "exception" not in declined.msg
    assert declined.msg["system"] == "tool_loop" and "content filter" in declined.msg["error"]


@pytest.mark.parametrize(
    ("status", "level", "kind", "told"),
    [
        (401, "ERROR", "LLMAuthError", "the AI model refused the bot's access"),
        (503, "WARNING", "LLMUnavailable", "I can't reach the AI model right now"),  # answered later
        # A model name the server lacks: it was "the AI model sent an answer that could not be used",
        # and "send another message to try again", which fails the same way until the operator acts.
        (404, "ERROR", "LLMNotFound", "the AI model is not set up right; the operator needs to check"),
    ],
)
async def test_a_model_failure_the_client_classified_is_one_line_with_a_fix_not_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, status: int, level: str, kind: str, told: str
) -> None:
    """A refused key or a provider outage (after the client's retries) is expected and already explained:
    it went through ``system_failed`` with a traceback into the HTTP client, as if membot had a bug. The
    operator gets one line saying what failed and where to look; only what needs them is an error."""
    async with FakeLLMServer() as llm:
        llm.responder = lambda api, body: FakeReply(status=status)
        settings = await settings_for(
            tmp_path / "ws", llm, llm_extra={"max_retries": 1, "retry_base_delay": 0}
        )
        out = await chat_once(settings, ["hello"], told)
    assert told in out
    events = [r for r in caplog.records if isinstance(r.msg, dict)]
    assert [r.msg["system"] for r in events if r.msg["event"] == "system_failed"] == []
    [failed] = [r for r in events if r.msg["event"] == "llm_failed"]
    assert failed.levelname == level and not failed.exc_info and "exception" not in failed.msg
    assert (
        failed.msg["kind"] == kind and failed.msg["status"] == status and failed.msg["system"] == "tool_loop"
    )
    assert failed.msg["hint"] and failed.msg["model"] == "gpt-4.1-mini"
    assert "sk-test-key-123456" not in caplog.text
    # The hint agrees with the error: a 404 said "check MEMBOT_LLM__MODEL" beside a hint that the
    # server's answer was unreadable and llm.provider to blame.
    assert "not one membot can read" not in failed.msg["hint"]


@pytest.mark.parametrize("join_pastes", [True, False])
async def test_windows_and_old_mac_line_ends_become_plain_line_breaks(join_pastes: bool) -> None:
    """A text with CRLF (or lone CR) line ends reached the session and the model with its ``\\r`` in it,
    a lone CR as no line break at all. (From a pipe or file, or a terminal that passes CR on.)"""
    taken: asyncio.Queue[InboundMessage] = asyncio.Queue()

    async def take(message: InboundMessage) -> None:
        await taken.put(message)

    reader = asyncio.StreamReader()
    channel = TerminalChannel(take, user="alice", reader=reader, writer=Screen(), join_pastes=join_pastes)
    await channel.start()
    reader.feed_data(b"  first line\r\nsecond line\r\n\r\nthird\rfourth\r\n")
    reader.feed_eof()
    await channel.wait_closed()
    await channel.stop()
    texts = []
    while not taken.empty():
        texts.append(taken.get_nowait().text)
    if join_pastes:  # one paste, one message
        assert texts == ["  first line\nsecond line\n\nthird\nfourth"]
    else:  # one message per line, as scripts expect
        assert texts == ["first line", "second line", "third\nfourth"]
