"""Chats Telegram refuses for good (the user blocked the bot, the bot was kicked, the chat is gone), end
to end: fake Telegram with the Bot API's own error bodies → real PTB → TelegramChannel → the real core.

Such an answer used to be sent again with growing pauses for an hour while the chat's later answers
waited behind it. Now it is set aside at once (kept in the inbox, logged with what to do), and the
chat's later answers are each tried once. Rate limits and 5xx stay temporary: sent again, not set aside.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from bot.config import Settings
from bot.domain import OutboundMessage
from bot.errors import ChannelRefused
from bot.inbox import Inbox
from bot.lifecycle import ServiceRunner
from bot.logging import SecretRedactor
from bot.metrics import Metrics
from bot.serve import serve_ops
from tests.bot.cli.test_doctor import doctor, line
from tests.channels.telegram.kit import running_channel
from tests.channels.telegram.test_end_to_end import settings_for, telegram_bot
from tests.fakes.llm_server import FakeLLMServer
from tests.fakes.llm_wire import FakeReply
from tests.fakes.telegram_server import BLOCKED, CHAT_NOT_FOUND, KICKED, FakeTelegramServer


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


def levels(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.levelname for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


def tries(tg: FakeTelegramServer, chat: int) -> list[str]:
    return [str(c.params["text"]) for c in tg.calls_to("sendMessage") if c.params.get("chat_id") == chat]


async def test_an_answer_to_a_user_who_blocked_the_bot_is_set_aside_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It was sent again for an hour, its chat's later answers waiting behind it."""
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        settings = await settings_for(tmp_path / "ws", llm, tg, allowed_users=["42", "43"])
        async with telegram_bot(settings, chat_interval=0.01) as core:
            tg.refuse_chat(777)  # Alice blocked the bot; Bob (778) did not
            tg.push_message("first", chat_id=777)
            tg.push_message("hello", chat_id=778, user_id=43)
            [other] = await tg.wait_for_messages(1, chat_id=778)
            async with asyncio.timeout(5):
                await core.dispatcher.settled("telegram:777")
            assert other.text == "echo: hello"
            assert tries(tg, 777) == ["echo: first"]  # once: no retry storm
            [refused] = logged(caplog, "reply_refused")
            assert refused["chat_id"] == "777" and refused["reason"] == "the user blocked the bot"
            assert "unblock" in str(refused["fix"]) and "blocked by the user" in str(refused["error"])
            # The user's own doing, nothing the operator could fix: warnings, not errors.
            assert levels(caplog, "reply_refused") == ["WARNING"]
            assert levels(caplog, "telegram_send_refused_by_user") == ["WARNING"]
            assert not levels(caplog, "telegram_send_failed")
            [aside] = logged(caplog, "reply_set_aside")
            assert aside["kept_in"] == str(core.inbox.file("telegram:777"))
            assert [r.text for r in core.inbox.kept_replies("telegram:777")] == ["echo: first"]

            # A later answer in the same chat is tried once too (after the one set aside), not held.
            tg.push_message("second", chat_id=777)
            await tg.wait_for(lambda: len(tries(tg, 777)) == 3)
            async with asyncio.timeout(5):
                await core.dispatcher.settled("telegram:777")
            assert tries(tg, 777) == ["echo: first", "echo: first", "echo: second"]

            # Unblocked: the next answer brings the ones set aside first, in order.
            tg.allow_chat(777)
            tg.push_message("third", chat_id=777)
            delivered = await tg.wait_for_messages(3, chat_id=777)
            async with asyncio.timeout(5):
                await core.dispatcher.settled("telegram:777")
            assert [m.text for m in delivered] == ["echo: first", "echo: second", "echo: third"]
            assert core.inbox.kept_replies("telegram:777") == []
    assert await Inbox(tmp_path / "ws" / "inbox").load_pending() == []  # all done: nothing sent twice


async def test_an_answer_set_aside_is_sent_by_the_next_start_once_the_chat_is_reachable(
    tmp_path: Path,
) -> None:
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        settings = await settings_for(tmp_path / "ws", llm, tg)
        async with telegram_bot(settings) as core:
            tg.refuse_chat(777, KICKED)
            tg.push_message("hello")
            await tg.wait_for(lambda: len(tries(tg, 777)) == 1)
            async with asyncio.timeout(5):
                await core.dispatcher.settled("telegram:777")
        tg.allow_chat(777)
        async with telegram_bot(settings) as core:
            await core.dispatcher.recover()  # as `membot run` does at start
            [sent] = await tg.wait_for_messages(1)
        assert sent.text == "echo: hello" and len(llm.requests) == 1  # the saved answer, not asked again


def kept_for_long(settings: Settings, seconds: float) -> Settings:
    """``settings`` with ``dispatcher.kept_reply_max_age`` set to ``seconds``."""
    dispatcher = settings.dispatcher.model_copy(update={"kept_reply_max_age": seconds})
    return settings.model_copy(update={"dispatcher": dispatcher})


async def test_an_answer_set_aside_for_too_long_is_moved_to_the_expired_folder_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It was tried once at every start, forever, and its chat's inbox file never emptied."""
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        settings = await settings_for(tmp_path / "ws", llm, tg)
        async with telegram_bot(settings) as core:
            tg.refuse_chat(777)
            tg.push_message("hello")
            await tg.wait_for(lambda: len(tries(tg, 777)) == 1)
            async with asyncio.timeout(5):
                await core.dispatcher.settled("telegram:777")
            inbox_file = core.inbox.file("telegram:777")
        await asyncio.sleep(0.2)
        for _ in range(2):  # two starts: neither asks Telegram again
            async with telegram_bot(kept_for_long(settings, 0.1)) as core:
                await core.dispatcher.recover()
                await asyncio.sleep(0.2)
        assert tries(tg, 777) == ["echo: hello"]
    [expired] = logged(caplog, "kept_reply_expired")
    moved_to = tmp_path / "ws" / "inbox" / "expired" / inbox_file.name
    assert expired["chat_id"] == "777" and expired["moved_to"] == str(moved_to)
    [line] = moved_to.read_text().splitlines()
    assert json.loads(line)["reply"]["text"] == "echo: hello"  # the operator can still read it
    assert inbox_file.read_bytes() == b""  # nothing pending any more: the file was cut
    assert await Inbox(tmp_path / "ws" / "inbox").load_pending() == []


async def test_an_answer_set_aside_for_too_long_is_not_tried_before_the_chats_next_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        settings = await settings_for(tmp_path / "ws", llm, tg)
        async with telegram_bot(kept_for_long(settings, 0.3)) as core:
            tg.refuse_chat(777)
            tg.push_message("first")
            await tg.wait_for(lambda: len(tries(tg, 777)) == 1)
            async with asyncio.timeout(5):
                await core.dispatcher.settled("telegram:777")
            await asyncio.sleep(0.4)
            tg.allow_chat(777)
            tg.push_message("second")
            [sent] = await tg.wait_for_messages(1)
            async with asyncio.timeout(5):
                await core.dispatcher.settled("telegram:777")
            assert sent.text == "echo: second" and tries(tg, 777) == ["echo: first", "echo: second"]
            assert core.inbox.kept_replies("telegram:777") == []
    [expired] = logged(caplog, "kept_reply_expired")
    moved_to = tmp_path / "ws" / "inbox" / "expired" / core.inbox.file("telegram:777").name
    assert expired["moved_to"] == str(moved_to)
    assert json.loads(moved_to.read_text())["reply"]["text"] == "echo: first"
    assert await Inbox(tmp_path / "ws" / "inbox").load_pending() == []


async def test_a_streamed_answer_stops_trying_a_chat_that_refused_its_first_preview(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every later preview of the turn was posted again (about every 1.5 s for as long as it ran)."""
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        settings = await settings_for(tmp_path / "ws", llm, tg, streaming=True)
        async with telegram_bot(settings, stream_interval=0.0) as core:
            tg.refuse_chat(777)
            llm.script(FakeReply(text="The answer, streamed in three parts, is forty-two."))
            tg.push_message("hello")
            await tg.wait_for(lambda: logged(caplog, "reply_set_aside"))
            async with asyncio.timeout(5):
                await core.dispatcher.settled("telegram:777")
            [preview, final] = tries(tg, 777)
            assert final == "The answer, streamed in three parts, is forty-two."
            assert final.startswith(preview) and preview != final
            [stream_failed] = logged(caplog, "telegram_stream_failed")
            assert stream_failed["stopped"] is True
            assert [r.text for r in core.inbox.kept_replies("telegram:777")] == [final]  # the normal path


async def test_the_operators_views_count_the_answers_kept_aside_per_chat(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the log said that a chat gets nothing: /healthz, /metrics and doctor did not."""
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        settings = await settings_for(tmp_path / "ws", llm, tg)
        admin = settings.admin.model_copy(update={"enabled": True, "port": 0})
        settings = settings.model_copy(update={"admin": admin})
        llm_env = {
            "MEMBOT_LLM__OPENAI__BASE_URL": llm.openai_base_url,
            "MEMBOT_LLM__OPENAI__API_KEY": "sk-test-1234567890abcdef",
        }
        async with telegram_bot(settings) as core:
            redactor = SecretRedactor(settings.secrets)
            server = await serve_ops(core, Metrics(), ServiceRunner(settings.lifecycle), redactor)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
                tg.refuse_chat(777)
                tg.push_message("hello")
                await tg.wait_for(lambda: len(tries(tg, 777)) == 1)
                async with asyncio.timeout(5):
                    await core.dispatcher.settled("telegram:777")
                health = (await http.get("/healthz")).json()
                page = (await http.get("/metrics")).text
                code, out = await doctor(tmp_path, offline=True, **llm_env)  # beside the running bot

                tg.allow_chat(777)
                tg.push_message("again")
                await tg.wait_for_messages(2)
                async with asyncio.timeout(5):
                    await core.dispatcher.settled("telegram:777")
                after = (await http.get("/healthz")).json()
                _, out_after = await doctor(tmp_path, offline=True, **llm_env)
    assert health["kept_answers"] == {"total": 1, "chats": {"telegram:777": 1}}
    assert "membot_kept_answers 1.0" in page.splitlines()
    assert code == 0, out
    check = line(out, "kept answers")
    assert "warn" in check and "1 answer(s) not delivered" in check and "telegram:777 (1)" in check
    assert "reply_refused" in check and "7 days" in check
    assert after["kept_answers"] == {"total": 0, "chats": {}}
    assert "pass" in line(out_after, "kept answers")


@pytest.mark.parametrize(
    ("refusal", "reason"),
    [
        (BLOCKED, "the user blocked the bot"),
        (KICKED, "the bot was removed from the group"),
        (CHAT_NOT_FOUND, "Telegram knows no such chat"),
    ],
)
async def test_a_chat_refused_for_good_is_a_channel_refusal_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, refusal: tuple[int, str], reason: str
) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (channel, _):
        tg.refuse_chat(777, refusal)
        with pytest.raises(ChannelRefused, match="777") as raised:
            await channel.send(OutboundMessage("telegram", "777", "anyone there?"))
    assert raised.value.reason.startswith(reason)
    # A user who blocked the bot is their own doing (a warning); the others need the operator (an error).
    by_user = refusal == BLOCKED
    assert raised.value.by_user is by_user
    assert levels(caplog, "telegram_send_refused_by_user") == (["WARNING"] if by_user else [])
    assert levels(caplog, "telegram_send_failed") == ([] if by_user else ["ERROR"])
    assert len(tg.calls_to("sendMessage")) == 1  # the channel does not retry it either


@pytest.mark.parametrize(
    ("status", "description", "retry_after"),
    [(429, "Too Many Requests: retry after 1", 1), (502, "Bad Gateway", None)],
    ids=["rate-limited", "5xx"],
)
async def test_rate_limits_and_server_errors_stay_temporary(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    status: int,
    description: str,
    retry_after: int | None,
) -> None:
    """Past the channel's retries they are sent again by the dispatcher, not set aside."""
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        settings = await settings_for(tmp_path / "ws", llm, tg)
        async with telegram_bot(settings, max_retries=0, retry_base_delay=0.01) as core:
            tg.fail("sendMessage", status, description, retry_after=retry_after)
            tg.push_message("hello")
            [sent] = await tg.wait_for_messages(1)
            async with asyncio.timeout(5):
                await core.dispatcher.settled("telegram:777")
        assert sent.text == "echo: hello" and len(tries(tg, 777)) == 2
        assert logged(caplog, "reply_sent_late") and not logged(caplog, "reply_refused")
