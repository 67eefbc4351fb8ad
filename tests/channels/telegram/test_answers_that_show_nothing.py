"""An answer whose HTML shows no text (a link with none, an empty quote or heading) reaches the chat as
written, and the chat goes on.

Telegram counts what a message shows: ``<a href="…"></a>`` alone is "Bad Request: message text is
empty", which is no parse error, so the plain-text fallback was never tried, every send of the answer
failed the same way, and the chat's later answers waited behind it for the send patience (an hour).
The whole way: fake Telegram, real PTB, dispatcher, pipeline and model client, fake model server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.channels.telegram.test_end_to_end import settings_for, telegram_bot
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.telegram_server import FakeTelegramServer


@pytest.mark.parametrize("answer", ["[](https://example.com)", "> ", "# "])
async def test_an_answer_that_renders_to_no_text_is_sent_as_written(tmp_path: Path, answer: str) -> None:
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(text=answer))
        async with telegram_bot(await settings_for(tmp_path / "ws", llm, tg)):
            tg.push_message("show me")
            [shown] = await tg.wait_for_messages(1, timeout=30)
            tg.push_message("and then?")
            [_, then] = await tg.wait_for_messages(2, timeout=30)
    assert shown.parse_mode is None and shown.text == answer
    assert then.text == "echo: and then?"
