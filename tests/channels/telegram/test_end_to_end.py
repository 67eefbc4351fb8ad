"""The whole way: fake Telegram → real PTB → TelegramChannel → Dispatcher → pipeline → fake LLM → back.

Nothing of ours is replaced: the composition root builds the core, the channel is wired the way
bot/app.py wires it, and both ends are real HTTP servers on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bot.app import Core, build_core
from bot.config import Settings, load_settings
from bot.pairing import PAIRING_FILE, PairingStore
from channels.telegram import TelegramChannel
from tests.channels.telegram.kit import all_taken_in, telegram_values
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.telegram_server import FakeTelegramServer

CUT_NOTE_START = "(the answer was cut here"
MAX_ANSWER_CHARS = 40_000  # bot/long_answers.py
JPEG = b"\xff\xd8\xff\xe0fake-jpeg-bytes"


async def settings_for(
    workspace: Path, llm: FakeLLMServer, tg: FakeTelegramServer, **telegram: Any
) -> Settings:
    overrides: dict[str, Any] = {
        "workspace": workspace,
        "llm": {
            "model": "gpt-4.1-mini",
            "openai": {"base_url": llm.openai_base_url, "api_key": "sk-test-1234567890abcdef"},
        },
        "telegram": telegram_values(tg, **telegram),
    }
    return await asyncio.to_thread(load_settings, None, env_file=None, overrides=overrides)


@contextlib.asynccontextmanager
async def telegram_bot(settings: Settings, **channel: Any) -> AsyncIterator[Core]:
    """What bot/app.py does for Telegram, in the same order; ``channel`` adds TelegramChannel arguments."""
    async with build_core(settings) as core:
        channel = TelegramChannel(
            settings.telegram,
            core.dispatcher.submit,
            pairing=PairingStore(settings.workspace / PAIRING_FILE),
            state_dir=settings.workspace / "state",
            commands=core.commands.commands,
            vision_supported=lambda: core.catalog.get(settings.llm.model).supports_vision,
            max_inbound_chars=settings.sessions.max_inbound_chars,
            typing_interval=0.05,
            **channel,
        )
        core.dispatcher.attach(channel)
        await channel.start()
        try:
            yield core
        finally:
            await channel.stop()


async def test_private_chat_round_trip_through_the_pipeline(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        async with telegram_bot(await settings_for(tmp_path / "ws", llm, tg)):
            tg.push_message("my name is **Alice** & I like <b>tags</b>")
            [reply] = await tg.wait_for_messages(1)
            tg.push_message("/help")
            [_, help_reply] = await tg.wait_for_messages(2)
        assert reply.text == "echo: my name is **Alice** & I like <b>tags</b>".replace("**", "")
        assert reply.parse_mode == "HTML"
        assert tg.calls_to("sendChatAction"), "typing was shown while the turn ran"
        assert "/help" in help_reply.text and "/stop" in help_reply.text
        assert "/quit" not in help_reply.text  # the terminal's own, which Telegram would not know
        [menu] = [call.params["commands"] for call in tg.calls_to("setMyCommands")]
        assert "quit" not in json.dumps(menu)
        assert len(llm.requests) == 1  # the command never reached the model
        user_turn = llm.requests[0].body["messages"][-1]
        assert user_turn["role"] == "user" and "Alice" in json.dumps(user_turn)
        header = json.loads((tmp_path / "ws" / "sessions" / "telegram:777.json").read_text())
        assert header["log_count"] == 2


async def test_photo_reaches_a_vision_model_as_an_image(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        async with telegram_bot(await settings_for(tmp_path / "ws", llm, tg)):
            file_id = tg.add_file(JPEG, "photos/file_1.jpg")
            photo = [
                {"file_id": "thumb", "file_unique_id": "t", "width": 90, "height": 90, "file_size": 10},
                {
                    "file_id": file_id,
                    "file_unique_id": "p",
                    "width": 800,
                    "height": 600,
                    "file_size": len(JPEG),
                },
            ]
            tg.push_message(None, photo=photo, caption="what is in this picture?")
            await tg.wait_for_messages(1)
        [request] = llm.requests
        content = request.body["messages"][-1]["content"]
        assert isinstance(content, list)
        images = [part["image_url"]["url"] for part in content if part["type"] == "image_url"]
        assert images == ["data:image/jpeg;base64," + base64.b64encode(JPEG).decode()]
        assert "what is in this picture?" in json.dumps(content)
        assert [c.params["file_id"] for c in tg.calls_to("getFile")] == [file_id]  # the largest size


async def test_a_stranger_never_reaches_the_model(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        async with telegram_bot(await settings_for(tmp_path / "ws", llm, tg)):
            tg.push_message("/status", chat_id=99, user_id=99)
            tg.push_message("hello from mallory", chat_id=99, user_id=99)
            tg.push_message("sentinel")  # user 42's: once it is answered, all three were accepted
            [answer] = await tg.wait_for_messages(1)
            await all_taken_in(tmp_path / "ws" / "state")  # and the stranger's two decided
            replies = tg.sent_to(99)
        assert answer.text == "echo: sentinel"
        assert [("membot pairing approve" in r.text) for r in replies] == [True]  # one offer a minute
        assert not any("mallory" in json.dumps(r.body) for r in llm.requests)
        assert not (tmp_path / "ws" / "sessions" / "telegram:99.json").exists()


async def test_a_message_with_a_lone_surrogate_is_answered_not_dropped(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        async with telegram_bot(await settings_for(tmp_path / "ws", llm, tg)):
            # The Bot API's JSON escapes it as \ud800; PTB decodes it into a str no codec can encode.
            tg.push_message("half an emoji \ud83d here", first_name="Al\udc00ice")
            [reply] = await tg.wait_for_messages(1)
        assert reply.text == "echo: half an emoji \ufffd here"
        assert "\ufffd" in llm.requests[-1].body["messages"][-1]["content"]


async def test_a_runaway_answer_reaches_the_chat_cut_with_a_note(tmp_path: Path) -> None:
    """A server that ignores ``max_tokens`` can stream megabytes of answer: the chat got it all, as
    dozens of messages at one a second, and the next turn sent it all back to the model. The chat gets
    at most MAX_ANSWER_CHARS with a plain note that the answer was cut; the session keeps that cut
    version (what the chat saw), so the runaway is not fed to the model again."""
    paragraph = "All work and no play makes Jack a dull boy. " * 20
    runaway = "\n\n".join(f"{i}. {paragraph}" for i in range(250)) + "\n\nTHE-VERY-END"
    assert len(runaway) > 200_000
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(text=runaway))
        async with telegram_bot(await settings_for(tmp_path / "ws", llm, tg), chat_interval=0):
            tg.push_message("tell me everything")
            await tg.wait_for(lambda: any(CUT_NOTE_START in m.text for m in tg.sent_to(777)))
            tg.push_message("thanks")
            await tg.wait_for(lambda: any(m.text == "echo: thanks" for m in tg.sent_to(777)))
        sent = [m.text for m in tg.sent_to(777)][:-1]
    assert sent[-1].endswith("(the answer was cut here: it was longer than 40,000 characters)")
    assert sum(map(len, sent)) <= MAX_ANSWER_CHARS and len(sent) <= 15
    assert "".join(sent).startswith("0. All work") and "THE-VERY-END" not in "".join(sent)
    [asked_again] = [r for r in llm.requests if "thanks" in json.dumps(r.body["messages"][-1])]
    history = json.dumps(asked_again.body["messages"])
    assert CUT_NOTE_START in history and "THE-VERY-END" not in history
    assert len(history) < MAX_ANSWER_CHARS + 10_000


async def test_status_shows_the_days_cost_to_the_listed_users_unless_admins_are_named(tmp_path: Path) -> None:
    """The users ``allowed_users`` names one by one are the operators when ``admin_users`` names none (a
    bot for one person shows its owner the cost); once it names some, only they see it."""
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        async with telegram_bot(await settings_for(tmp_path / "a", llm, tg)):
            tg.push_message("/status")  # user 42, in a private chat
            [owner_view] = await tg.wait_for_messages(1)
        async with telegram_bot(await settings_for(tmp_path / "b", llm, tg, admin_users=["7"])):
            tg.push_message("/status")
            [_, member_view] = await tg.wait_for_messages(2)
    assert "Today (all chats)" in owner_view.text and "$" in owner_view.text
    assert "Today (all chats)" not in member_view.text and "$" not in member_view.text
