"""``membot memory edit`` beside a running ``membot run``: neither the operator's edit nor the bot's write
is lost when the bot writes MEMORY.md while the operator's editor is open."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from tests.bot.cli.membot_process import run_membot
from tests.bot.membot_service import membot_run, telegram_env
from tests.bot.test_consolidation_recovery import TRIM, consolidating, read, stop, wait_until
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.telegram_server import FakeTelegramServer

BEFORE = "- User lives in Porto\n- User likes tea\n"
FACT = "- User flies to Lisbon on May 3rd"
SUMMARY = json.dumps({"history_entry": "We planned the Lisbon trip.", "memory_update": BEFORE + FACT + "\n"})
# The operator's editor: says it has the copy open, waits to be let go, then corrects a line, removes one
# and adds one, saving in place.
EDITOR = """
import os, pathlib, sys, time
copy = pathlib.Path(sys.argv[1])
pathlib.Path(os.environ["EDIT_READY"]).write_text(copy.read_text())
while not pathlib.Path(os.environ["EDIT_GO"]).exists():
    time.sleep(0.02)
text = copy.read_text().replace("Porto", "Coimbra").replace("- User likes tea\\n", "")
copy.write_text(text + "- User is allergic to peanuts\\n")
"""


async def test_an_edit_open_while_the_bot_writes_memory_md_keeps_both(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    memory_md = workspace / "memory" / "MEMORY.md"
    memory_md.parent.mkdir(parents=True)
    memory_md.write_text(BEFORE)
    editor, ready, go = tmp_path / "editor.py", tmp_path / "ready", tmp_path / "go"
    editor.write_text(EDITOR)
    edit_env = {
        "MEMBOT_WORKSPACE": str(workspace),
        "HOME": str(tmp_path),
        "EDITOR": f"{sys.executable} {editor}",
        "EDIT_READY": str(ready),
        "EDIT_GO": str(go),
    }

    def answer(_api: str, body: dict[str, Any]) -> FakeReply | None:
        return FakeReply(text=SUMMARY) if consolidating(body) else None

    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.responder = answer
        async with membot_run(workspace, llm, **telegram_env(tg, **TRIM)) as service:
            editing = asyncio.create_task(asyncio.to_thread(run_membot, "memory", "edit", env=edit_env))
            await wait_until(ready.exists)
            assert ready.read_text() == BEFORE  # the operator is editing a copy of this
            for n in range(3):
                tg.push_message(f"Lisbon trip, part {n}", chat_id=777, user_id=42)
                await tg.wait_for_messages(n + 1, chat_id=777, timeout=30)
            await wait_until(lambda: FACT in read(memory_md))  # the bot wrote meanwhile
            go.touch()
            done = await editing
            assert done.returncode == 0, done.stderr
            assert "merged" in done.stdout

            expected = ["- User lives in Coimbra", "- User is allergic to peanuts", FACT]
            assert read(memory_md).splitlines() == expected
            tg.push_message("Lisbon trip, part 3", chat_id=777, user_id=42)  # the bot reads it again
            await tg.wait_for_messages(4, chat_id=777, timeout=30)
            await stop(service)

    assert read(memory_md).splitlines() == expected
    last = [r.body for r in llm.requests if not consolidating(r.body)][-1]
    system = json.dumps(last["messages"][0])  # the system prompt of the turn after the edit
    assert "User lives in Coimbra" in system and "Porto" not in system and "likes tea" not in system
