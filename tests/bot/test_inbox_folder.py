"""A folder where a chat's inbox file belongs refuses every write for good: it is moved aside (at the
start, or when a write finds it) so the chat is answered again, and nothing pending is lost with it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.bot.test_dispatcher import ModelSystem
from tests.bot.test_dispatcher_recovery import msg, pending, settled, started


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


def folder_in_place(path: Path) -> None:
    """A folder, with something in it, where the file ``path`` belongs (a file there is removed)."""
    path.unlink(missing_ok=True)
    path.mkdir(parents=True)
    (path / "note.txt").write_text("put here by hand\n")


async def test_a_folder_in_place_of_an_inbox_file_at_the_start_is_moved_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "inbox" / "test:c1.jsonl"
    folder_in_place(folder)
    model = ModelSystem()
    dispatcher, channel, _ = await started(tmp_path, model)
    await dispatcher.submit(msg("hello", message_id="1"))  # refused for good before: IsADirectoryError
    assert [m.text for m in await channel.wait_for(1)] == ["answer to hello"]
    await settled(tmp_path)
    await dispatcher.close(grace=1)
    [moved] = (tmp_path / "inbox").glob("test:c1.jsonl.corrupt-*")
    assert (moved / "note.txt").read_text() == "put here by hand\n"
    [line] = logged(caplog, "inbox_file_is_a_folder")
    assert line["path"] == str(folder) and line["moved_to"] == str(moved)
    assert folder.is_file()


async def test_a_folder_in_place_of_an_inbox_file_while_running_is_moved_aside_and_nothing_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It appears while "first" is answered and "second" waits: the done mark, and "third" after it, go
    to the file written anew, which still holds "second" (its line was in the file the folder replaced)."""
    model = ModelSystem()
    model.gate = asyncio.Event()
    dispatcher, channel, _ = await started(tmp_path, model, mode="per_message")
    await dispatcher.submit(msg("first", message_id="1"))
    await model.started.wait()
    await dispatcher.submit(msg("second", message_id="2"))
    [file] = (tmp_path / "inbox").glob("*.jsonl")
    folder_in_place(file)
    await dispatcher.submit(msg("third", message_id="3"))  # refused for good before: IsADirectoryError
    assert await pending(tmp_path) == ["first", "second", "third"]  # what a kill now would find
    model.gate.set()
    await channel.wait_for(3)
    await settled(tmp_path)
    await dispatcher.close(grace=1)
    assert model.seen == ["first", "second", "third"]
    [line] = logged(caplog, "inbox_file_is_a_folder")
    [moved] = (tmp_path / "inbox").glob("*.jsonl.corrupt-*")
    assert line["moved_to"] == str(moved) and (moved / "note.txt").exists()

    model = ModelSystem()  # the next start answers nothing again
    dispatcher, channel, _ = await started(tmp_path, model)
    await dispatcher.close(grace=1)
    assert model.seen == [] and channel.sent == []
