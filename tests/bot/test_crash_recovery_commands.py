"""A command's reply survives a kill, proven on the real ``membot run`` process with protocol fakes.

/new and /compact change the conversation and note themselves as run with that change, so that a
platform's redelivery does not run them twice. Their reply came after that note and was never kept: a
kill (or a Telegram outage, then a kill) between the two lost it for good, since the next start found the
command run and ignored it. The chat never learnt that its conversation had been cleared.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.bot.membot_service import membot_run, telegram_env
from tests.bot.test_crash_recovery import answers, stop, wait_answer
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.telegram_server import FakeTelegramServer

CLEARED = "Session cleared."


def clearing(params: dict[str, Any]) -> bool:
    return CLEARED in str(params.get("text"))


async def test_a_new_whose_reply_a_kill_cut_off_is_answered_once_after_restart(tmp_path: Path) -> None:
    """/new ran at once (the chat was idle) and saved the cleared conversation; Telegram was down for its
    reply, and the bot was killed meanwhile. The next start tells the chat, once."""
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        env = telegram_env(tg, MEMBOT_MEMORY__EMBEDDINGS="none")
        async with membot_run(workspace, llm, **env) as service:
            tg.push_message("hello", chat_id=777, user_id=42)
            await wait_answer(tg, 777, "echo: hello")
            tg.fail("sendMessage", 502, "Bad Gateway", times=1000, when=clearing)
            tg.push_message("/new", chat_id=777, user_id=42)
            await tg.wait_for(lambda: any(clearing(c.params) for c in tg.calls), timeout=30)
            await service.kill()
        tg.failures.clear()
        assert not answers(tg, 777, CLEARED)
        async with membot_run(workspace, llm, **env) as service:
            await wait_answer(tg, 777, CLEARED)
            tg.push_message("and now?", chat_id=777, user_id=42)
            await wait_answer(tg, 777, "echo: and now?")
            await stop(service)
        assert len(answers(tg, 777, CLEARED)) == 1


async def test_a_waiting_new_whose_reply_a_kill_cut_off_is_answered_once_after_restart(
    tmp_path: Path,
) -> None:
    """/new waited for a turn, kept in the inbox, then ran; Telegram was down for its reply and the bot
    was killed. The next start tells the chat, once, and before the answer to what came after it."""
    workspace = tmp_path / "ws"
    held = asyncio.Event()
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        env = telegram_env(tg, MEMBOT_MEMORY__EMBEDDINGS="none")
        async with membot_run(workspace, llm, **env) as service:
            llm.script(FakeReply(text="slow answer", hold=held))
            tg.push_message("take your time", chat_id=777, user_id=42)
            await tg.wait_for(lambda: llm.in_flight > 0, timeout=30)
            tg.push_message("/new", chat_id=777, user_id=42)
            await wait_answer(tg, 777, "/new runs as soon as the current reply is done")
            tg.fail("sendMessage", 502, "Bad Gateway", times=1000, when=clearing)
            held.set()
            await wait_answer(tg, 777, "slow answer")
            await tg.wait_for(lambda: any(clearing(c.params) for c in tg.calls), timeout=30)
            await service.kill()
        tg.failures.clear()
        assert not answers(tg, 777, CLEARED)
        async with membot_run(workspace, llm, **env) as service:
            tg.push_message("and now?", chat_id=777, user_id=42)
            await wait_answer(tg, 777, "echo: and now?")
            await stop(service)
        texts = [m.text for m in tg.sent_to(777)]
        assert texts.count(CLEARED) == 1, texts
        assert texts.index(CLEARED) < texts.index("echo: and now?"), texts
