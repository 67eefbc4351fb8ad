"""The tool loop with a record of its calls (bot/tools/journal.py): a rerun of the same turn gets the
results its first run had, call by call, and a record that cannot be written never costs a result."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.domain import InboundMessage
from bot.tools import ToolJournal
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.pipeline.test_tool_loop import AddTool, loop_for, new_turn, tool_results


def turn_with_id(message_id: str = "m1"):  # type: ignore[no-untyped-def]
    turn = new_turn()
    turn.inbound = (InboundMessage("test", "chat", "u1", "please compute", message_id=message_id),)
    return turn


def script(server: FakeLLMServer) -> None:
    server.script(  # the same call twice (the second is its own call), then another
        FakeReply(tool_calls=[("add", {"a": 1, "b": 2})]),
        FakeReply(tool_calls=[("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]),
        FakeReply(text="done"),
    )


async def test_a_rerun_of_the_turn_gets_each_call_its_first_run_made(
    server: FakeLLMServer, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    journal = ToolJournal(tmp_path / "tool_calls")
    first, again = AddTool(), AddTool()
    script(server)
    await loop_for(server, http, "openai", [first], journal=journal).process(one := turn_with_id())
    script(server)
    await loop_for(server, http, "openai", [again], journal=journal).process(rerun := turn_with_id())
    assert len(first.calls) == 3 and again.calls == []  # nothing ran twice
    assert tool_results(rerun.session) == tool_results(one.session) == ["3", "3", "7"]

    script(server)  # another turn of the chat: its calls are its own
    await loop_for(server, http, "openai", [again], journal=journal).process(turn_with_id("m2"))
    assert len(again.calls) == 3


async def test_a_record_that_cannot_be_written_costs_no_result(
    server: FakeLLMServer, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    (tmp_path / "tool_calls").write_text("a file where the folder should be")
    add = AddTool()
    script(server)
    turn = turn_with_id()
    await loop_for(server, http, "openai", [add], journal=ToolJournal(tmp_path / "tool_calls")).process(turn)
    assert tool_results(turn.session) == ["3", "3", "7"] and turn.reply == "done"


async def test_a_record_the_full_disk_refused_at_the_first_call_keeps_the_later_ones_for_a_rerun(
    server: FakeLLMServer, http: httpx.AsyncClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk was full at the turn's first record and had room again for the next ones. The failed
    append left the record's file empty; the later records went in without the line naming their turn,
    so a rerun took the whole record for an earlier turn's and ran every call again."""
    real = os.write
    refused: list[int] = []

    def write(fd: int, data: Any) -> int:  # at the system call: our code runs as it would
        if not refused and "/tool_calls/" in os.readlink(f"/proc/self/fd/{fd}"):
            refused.append(fd)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    journal = ToolJournal(tmp_path / "tool_calls")
    first, again = AddTool(), AddTool()
    script(server)
    await loop_for(server, http, "openai", [first], journal=journal).process(turn_with_id())
    assert refused and len(first.calls) == 3
    script(server)  # the turn again, as after a kill before its answer was saved
    await loop_for(server, http, "openai", [again], journal=journal).process(rerun := turn_with_id())
    assert len(again.calls) == 1  # only the call whose record the disk refused runs again
    assert tool_results(rerun.session) == ["3", "3", "7"]
