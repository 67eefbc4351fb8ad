"""What Discord already shows is not sent again when the same answer goes out once more.

Each test streams or sends an answer from one channel, stops it, and sends it again from a channel
started afresh on the same workspace, as the next start after a kill does (``bot/recovery.py``): the
channel's memory is gone, only ``state/discord_sent.json`` is left. (The real process, killed, is in
``tests/bot/test_crash_recovery_discord.py``.)
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.domain import OutboundMessage
from bot.errors import ChannelError
from channels.discord import DiscordChannel
from tests.channels.discord.kit import running_bot
from tests.fakes.discord_server import FakeDiscord, snowflake
from tests.fakes.llm_server import FakeLLMServer

SENT_FILE = "discord_sent.json"  # in the workspace's state/


@contextlib.asynccontextmanager
async def running_channel(
    fake: FakeDiscord, llm: FakeLLMServer, workspace: Path
) -> AsyncIterator[DiscordChannel]:
    """The bot's Discord channel (streaming on) on ``workspace``; stopped on exit, as a kill leaves it."""
    section = {"allowed_users": [], "streaming": True, "stream_edit_interval": 0.2, "send_retries": 0}
    async with running_bot(fake, llm, workspace, section) as (_, channel):
        yield channel


def posts(fake: FakeDiscord, chat: str) -> int:
    return sum(1 for r in fake.requests if r.method == "POST" and r.path == f"/channels/{chat}/messages")


async def streamed_then_stopped(
    fake: FakeDiscord, llm: FakeLLMServer, workspace: Path, chat: str, question: str
) -> str:
    """A streamed answer to ``question`` shows its first words in a preview, then the channel stops as a
    kill would leave it: the preview in the chat, the answer not sent. Returns the preview's id."""
    async with running_channel(fake, llm, workspace) as channel:
        show = channel.partial_sink(chat, question)
        assert show is not None
        await show("The answer is")
    [preview] = fake.bot_messages
    assert preview["content"] == "The answer is …"
    return str(preview["id"])


async def test_an_answer_whose_preview_a_kill_cut_short_is_finished_in_that_preview(tmp_path: Path) -> None:
    """The saved answer sent again after the restart became a second message below the preview."""
    chat, question = snowflake(), snowflake()
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        preview = await streamed_then_stopped(fake, llm, tmp_path, chat, question)
        async with running_channel(fake, llm, tmp_path) as channel:
            answer = "The answer is forty-two."
            await channel.send(OutboundMessage("discord", chat, answer, reply_to=question, key="a-1"))
        assert fake.bot_texts(chat) == ["The answer is forty-two."]
        assert fake.bot_messages[0]["id"] == preview and posts(fake, chat) == 1


async def test_a_question_answered_anew_after_a_kill_streams_into_its_old_preview(tmp_path: Path) -> None:
    """No answer was saved before the kill: the question is answered again, and streamed again."""
    chat, question = snowflake(), snowflake()
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        await streamed_then_stopped(fake, llm, tmp_path, chat, question)
        async with running_channel(fake, llm, tmp_path) as channel:
            show = channel.partial_sink(chat, question)
            assert show is not None
            await show("Let me think")
            assert fake.bot_texts(chat) == ["Let me think …"]
            answer = "Let me think: 42."
            await channel.send(OutboundMessage("discord", chat, answer, reply_to=question, key="a-2"))
        assert fake.bot_texts(chat) == ["Let me think: 42."]
        assert posts(fake, chat) == 1


async def test_the_preview_of_another_question_is_left_alone(tmp_path: Path) -> None:
    chat, question = snowflake(), snowflake()
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        await streamed_then_stopped(fake, llm, tmp_path, chat, question)
        async with running_channel(fake, llm, tmp_path) as channel:
            other = OutboundMessage("discord", chat, "Another answer.", reply_to=snowflake(), key="a-3")
            await channel.send(other)
        assert fake.bot_texts(chat) == ["The answer is …", "Another answer."]


async def test_an_answer_whose_preview_was_deleted_goes_out_as_a_new_message(tmp_path: Path) -> None:
    """A moderator deleted the preview while the bot was down: the answer is posted, not lost, and the
    edit Discord refused (404, "Unknown Message") is not counted as a failed send."""
    chat, question = snowflake(), snowflake()
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        preview = await streamed_then_stopped(fake, llm, tmp_path, chat, question)
        fake.delete_message(preview)
        async with running_channel(fake, llm, tmp_path) as channel:
            answer = "The answer is forty-two."
            await channel.send(OutboundMessage("discord", chat, answer, reply_to=question, key="a-4"))
            assert channel.health.send_failures == 0
        assert fake.bot_texts(chat) == ["The answer is forty-two."]
        [sent] = fake.bot_messages
        assert sent["message_reference"]["message_id"] == int(question)  # it answers the question


async def test_an_answer_streamed_anew_after_its_preview_was_deleted_gets_a_new_preview(
    tmp_path: Path,
) -> None:
    chat, question = snowflake(), snowflake()
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        fake.delete_message(await streamed_then_stopped(fake, llm, tmp_path, chat, question))
        async with running_channel(fake, llm, tmp_path) as channel:
            show = channel.partial_sink(chat, question)
            assert show is not None
            await show("Let me think")
            answer = "Let me think: 42."
            await channel.send(OutboundMessage("discord", chat, answer, reply_to=question, key="a-5"))
        assert fake.bot_texts(chat) == ["Let me think: 42."]


PARTS = [f"PART-{n} " + "word " * 300 for n in (1, 2, 3)]  # ~1500 characters each: one message each


def starts(fake: FakeDiscord, chat: str) -> list[str]:
    return [text.split()[0] for text in fake.bot_texts(chat)]


async def test_a_long_answer_sent_again_minutes_later_goes_on_from_the_part_it_reached(
    tmp_path: Path,
) -> None:
    """Discord took the first part, then failed the second. Sent again after more than the few minutes
    Discord keeps a nonce for, the first part came twice."""
    chat = snowflake()
    answer = OutboundMessage("discord", chat, "\n\n".join(PARTS), reply_to=snowflake(), key="long-1")
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        fake.fail(
            "POST", f"/channels/{chat}/messages", times=100, when=lambda b: "PART-2" in b.get("content", "")
        )
        async with running_channel(fake, llm, tmp_path) as channel:
            with pytest.raises(ChannelError):
                await channel.send(answer)
        assert starts(fake, chat) == ["PART-1"]
        fake.clear_faults()
        fake.forget_nonces()
        async with running_channel(fake, llm, tmp_path) as channel:
            await channel.send(answer)
        assert starts(fake, chat) == ["PART-1", "PART-2", "PART-3"]


async def test_a_long_streamed_answer_sent_again_goes_on_after_the_part_in_its_preview(
    tmp_path: Path,
) -> None:
    """The first part went into the preview (an edit, with no nonce); the second failed. Sent again, the
    first part was posted as a new message below the preview that already showed it."""
    chat, question = snowflake(), snowflake()
    answer = OutboundMessage("discord", chat, "\n\n".join(PARTS), reply_to=question, key="long-2")
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        fake.fail(
            "POST", f"/channels/{chat}/messages", times=100, when=lambda b: "PART-2" in b.get("content", "")
        )
        async with running_channel(fake, llm, tmp_path) as channel:
            show = channel.partial_sink(chat, question)
            assert show is not None
            await show(PARTS[0][:100])
            with pytest.raises(ChannelError):
                await channel.send(answer)
        assert starts(fake, chat) == ["PART-1"]
        fake.clear_faults()
        async with running_channel(fake, llm, tmp_path) as channel:
            await channel.send(answer)
        assert starts(fake, chat) == ["PART-1", "PART-2", "PART-3"]
        assert fake.bot_texts(chat)[0].strip() == PARTS[0].strip()  # the preview, finished


async def test_the_record_keeps_only_answers_not_yet_done(tmp_path: Path) -> None:
    chat, question = snowflake(), snowflake()
    answer = OutboundMessage("discord", chat, "\n\n".join(PARTS), reply_to=question, key="long-3")
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        await streamed_then_stopped(fake, llm, tmp_path, chat, question)
        saved = json.loads((tmp_path / "state" / SENT_FILE).read_text())
        assert saved["previews"] == {chat: [question, fake.bot_messages[0]["id"]]}
        async with running_channel(fake, llm, tmp_path) as channel:
            await channel.send(answer)
        assert json.loads((tmp_path / "state" / SENT_FILE).read_text()) == {"answers": {}, "previews": {}}


async def test_the_record_is_bounded(tmp_path: Path) -> None:
    from channels.discord.sent import sent_parts  # (here: the other tests run on code from before it)

    sent = sent_parts(tmp_path / SENT_FILE, limit=2)
    for n in range(3):
        await sent.record(f"answer-{n}", 1)
        await sent.record_preview(f"chat-{n}", f"question-{n}", 100 + n)
    again = sent_parts(tmp_path / SENT_FILE, limit=2)
    await again.load()
    assert [again.get(f"answer-{n}") for n in range(3)] == [0, 1, 1]
    assert [again.preview(f"chat-{n}", f"question-{n}") for n in range(3)] == [None, 101, 102]


async def test_a_damaged_record_is_moved_aside_and_the_answer_still_goes_out(tmp_path: Path) -> None:
    chat = snowflake()
    state = tmp_path / "state"
    state.mkdir(parents=True)
    (state / SENT_FILE).write_text('{"answers": {"a-6": 1}, "previ')
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        async with running_channel(fake, llm, tmp_path) as channel:
            await channel.send(OutboundMessage("discord", chat, "\n\n".join(PARTS), key="a-6"))
        assert starts(fake, chat) == ["PART-1", "PART-2", "PART-3"]
    assert [p.name for p in state.iterdir() if p.name.startswith(SENT_FILE + ".")]  # kept for the operator
