"""A workspace copied while membot ran (``cp -a``, ``rsync``), then started: its files were copied at
different moments, and the bot comes up on what the copy holds, says what it repaired, and keeps every
conversation the copy has. Proven on the real ``membot run`` process with protocol fakes.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
from pathlib import Path

from tests.bot.membot_service import Service, membot_run, stored, telegram_env
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.telegram_server import FakeTelegramServer


async def _stop(service: Service) -> None:
    service.process.send_signal(signal.SIGTERM)
    code, _ = await service.finish()
    assert code == 0, service.stderr


async def _answered(tg: FakeTelegramServer, text: str) -> None:
    await tg.wait_for(lambda: any(text in m.text for m in tg.sent_to(777)), timeout=30)


async def test_a_copy_whose_header_names_a_log_it_did_not_take_keeps_the_conversation(
    tmp_path: Path,
) -> None:
    """The header was copied after a rewrite (compaction, /new) and the logs before it: the header names
    generation 2, the copy holds generation 1. The bot used to move the session aside as corrupt and
    start the chat afresh; it rebuilds the header from the log the copy has."""
    live, copy = tmp_path / "live", tmp_path / "copy" / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(text="Noted: you like tea."))
        async with membot_run(live, llm, **telegram_env(tg)) as service:
            tg.push_message("I like tea", chat_id=777, user_id=42)
            await _answered(tg, "Noted: you like tea.")
            await _stop(service)
        await asyncio.to_thread(shutil.copytree, live, copy)
        header = copy / "sessions" / "telegram:777.json"
        fields = json.loads(header.read_text())
        assert fields["log_generation"] == 1 and (copy / "sessions" / "telegram:777.1.jsonl").exists()
        header.write_text(json.dumps({**fields, "log_generation": 2}))  # a rewrite the logs missed

        llm.script(FakeReply(text="You like tea."))
        async with membot_run(copy, llm, **telegram_env(tg)) as service:
            tg.push_message("what do I like?", chat_id=777, user_id=42)
            await _answered(tg, "You like tea.")
            await _stop(service)
            assert service.logged("session_header_rebuilt")
        # The model saw the earlier turn: the conversation went on where the copy left it.
        assert "I like tea" in json.dumps(llm.requests[-1].body["messages"])
    assert await asyncio.to_thread(stored, copy, "telegram:777") == [
        ("user", "I like tea"),
        ("assistant", "Noted: you like tea."),
        ("user", "what do I like?"),
        ("assistant", "You like tea."),
    ]
    assert not list((copy / "sessions").glob("*.corrupt-*"))
    [kept] = (copy / "sessions").glob("telegram:777.json.damaged-*")  # the header as the copy had it
    assert json.loads(kept.read_text().strip())["log_generation"] == 2
