"""An answer Telegram refuses for what it says (a 400 that is not about the chat) is not kept to be
refused again before every later answer of the chat: the chat is told, in plain words, and goes on.
The whole way: fake Telegram, real PTB, dispatcher, pipeline and model client, fake model server."""

from __future__ import annotations

from pathlib import Path

from bot.dispatcher.delivery import REJECTED_NOTICE
from tests.channels.telegram.test_end_to_end import settings_for, telegram_bot
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.telegram_server import FakeTelegramServer


async def test_an_answer_telegram_refuses_for_its_content_is_told_and_the_chat_goes_on(
    tmp_path: Path,
) -> None:
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(text="the UNSENDABLE answer"))
        tg.fail(
            "sendMessage",
            400,
            "Bad Request: message text is empty",
            times=100,
            when=lambda p: "UNSENDABLE" in p["text"],
        )
        async with telegram_bot(await settings_for(tmp_path / "ws", llm, tg)):
            tg.push_message("show me")
            [told] = await tg.wait_for_messages(1, timeout=30)
            tries = len([c for c in tg.calls_to("sendMessage") if "UNSENDABLE" in c.params["text"]])
            tg.push_message("and then?")
            [_, then] = await tg.wait_for_messages(2, timeout=30)
            again = len([c for c in tg.calls_to("sendMessage") if "UNSENDABLE" in c.params["text"]])
    assert told.text == REJECTED_NOTICE.format(platform="Telegram")
    assert then.text == "echo: and then?"
    assert again == tries  # not tried again before the next answer
