"""What Telegram already showed is not sent again when the same answer goes out once more.

Each test sends an answer (same key) from one channel, stops, and sends it again from a channel started
afresh on the same ``state/`` folder, as the next start after a kill does (``bot/recovery.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.domain import OutboundMessage
from bot.errors import ChannelError
from tests.channels.telegram.kit import running_channel
from tests.fakes.telegram_server import FakeTelegramServer


def first_words(tg: FakeTelegramServer) -> list[str]:
    return [m.text.split()[0] for m in tg.sent_to(777)]


async def test_a_chunk_telegram_found_too_long_goes_on_from_the_half_it_took(tmp_path: Path) -> None:
    """Telegram finds the second chunk too long (its count and ours differ), so it goes out halved; the
    second half fails. Sent again, the answer goes on with the second half, not the whole chunk."""
    halves = [f"PART-2{h} " + "word " * 300 for h in "AB"]
    text = "\n\n".join(["PART-1 " + "word " * 700, *halves])
    answer = OutboundMessage("telegram", "777", text, key="answer-1")

    def whole(params: dict[str, object]) -> bool:
        return "PART-2A" in str(params.get("text")) and "PART-2B" in str(params.get("text"))

    async with FakeTelegramServer() as tg:
        tg.fail("sendMessage", 400, "Bad Request: message is too long", times=100, when=whole)
        tg.fail("sendMessage", 502, "Bad Gateway", times=100, when=lambda p: "PART-2B" in str(p.get("text")))
        down = tg.failures[-1]
        async with running_channel(tg, tmp_path) as (channel, _):
            with pytest.raises(ChannelError):
                await channel.send(answer)
        assert first_words(tg) == ["PART-1", "PART-2A"]
        tg.failures.remove(down)
        async with running_channel(tg, tmp_path) as (channel, _):
            await channel.send(answer)
        assert first_words(tg) == ["PART-1", "PART-2A", "PART-2B"]
        assert " ".join(m.text for m in tg.sent_to(777)).split() == text.split()


async def test_a_half_telegram_found_too_long_again_goes_on_from_its_own_half(tmp_path: Path) -> None:
    """Telegram finds the chunk too long, then its first half too: that half is halved again, and the
    record follows it down, a half of a half."""
    # One paragraph: halved, its first half is the lines 2A1 and 2A2 (too long again: halved once more).
    lines = [f"PART-2A{n} " + "word " * 100 for n in (1, 2)] + ["PART-2B " + "word " * 300]
    text = "\n\n".join(["PART-1 " + "word " * 700, "\n".join(lines)])
    answer = OutboundMessage("telegram", "777", text, key="answer-1")

    def too_long(params: dict[str, object]) -> bool:
        said = str(params.get("text"))
        return "PART-2A1" in said and "PART-2A2" in said

    async with FakeTelegramServer() as tg:
        tg.fail("sendMessage", 400, "Bad Request: message is too long", times=100, when=too_long)
        tg.fail("sendMessage", 502, "Bad Gateway", times=100, when=lambda p: "PART-2A2" in str(p.get("text")))
        down = tg.failures[-1]
        async with running_channel(tg, tmp_path) as (channel, _):
            with pytest.raises(ChannelError):
                await channel.send(answer)
        assert first_words(tg) == ["PART-1", "PART-2A1"]
        tg.failures.remove(down)
        async with running_channel(tg, tmp_path) as (channel, _):
            await channel.send(answer)
        assert first_words(tg)[:4] == ["PART-1", "PART-2A1", "PART-2A2", "PART-2B"]
        assert " ".join(m.text for m in tg.sent_to(777)).split() == text.split()


async def test_a_record_an_earlier_version_wrote_is_still_followed(tmp_path: Path) -> None:
    """Before halves were noted, the record was a plain count of chunks."""
    (tmp_path / "telegram_sent.json").write_text('{"answers": {"answer-1": 1}}\n')
    text = "\n\n".join(f"PART-{n} " + "word " * 700 for n in (1, 2))
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (channel, _):
        await channel.send(OutboundMessage("telegram", "777", text, key="answer-1"))
        assert first_words(tg) == ["PART-2"]


async def streamed_then_stopped(tg: FakeTelegramServer, tmp_path: Path, shown: str) -> None:
    """A streamed answer to the message 100 shows ``shown`` in its preview, then the channel stops, as a
    kill would leave it: the preview in the chat, the answer not sent."""
    async with running_channel(tg, tmp_path, streaming=True) as (channel, _):
        show = channel.partial_sink("777", "100")
        assert show is not None
        await show(shown)
    assert [m.text for m in tg.sent_to(777)] == [shown]


async def test_an_answer_whose_preview_a_kill_cut_short_is_finished_in_that_preview(tmp_path: Path) -> None:
    """The saved answer sent again after the restart becomes the preview's text, not a second message."""
    async with FakeTelegramServer() as tg:
        await streamed_then_stopped(tg, tmp_path, "The answer is")
        async with running_channel(tg, tmp_path, streaming=True) as (channel, _):
            answer = OutboundMessage("telegram", "777", "The answer is forty-two.", reply_to="100", key="a-1")
            await channel.send(answer)
        assert [m.text for m in tg.sent_to(777)] == ["The answer is forty-two."]
        assert len(tg.calls_to("sendMessage")) == 1


async def test_the_record_keeps_only_answers_not_yet_done(tmp_path: Path) -> None:
    """A finished answer was forgotten in memory only: the file went on naming it (and the preview) until
    some later answer was cut short. The stop writes what was forgotten."""
    record = tmp_path / "telegram_sent.json"
    record.write_text('{"answers": {"answer-1": 1}}\n')
    text = "\n\n".join(f"PART-{n} " + "word " * 700 for n in (1, 2))
    async with FakeTelegramServer() as tg:
        await streamed_then_stopped(tg, tmp_path, "The answer is")
        assert list(json.loads(record.read_text())["previews"]) == ["777"]
        async with running_channel(tg, tmp_path, streaming=True) as (channel, _):
            await channel.send(OutboundMessage("telegram", "777", text, key="answer-1"))
            answer = OutboundMessage("telegram", "777", "The answer is forty-two.", reply_to="100", key="a-1")
            await channel.send(answer)
    assert json.loads(record.read_text()) == {"answers": {}, "previews": {}}


async def test_a_question_answered_anew_after_a_kill_streams_into_its_old_preview(tmp_path: Path) -> None:
    """No answer was saved before the kill, so the question is answered again, streamed again."""
    async with FakeTelegramServer() as tg:
        await streamed_then_stopped(tg, tmp_path, "The answer is")
        async with running_channel(tg, tmp_path, streaming=True) as (channel, _):
            show = channel.partial_sink("777", "100")
            assert show is not None
            await show("Let me think")
            assert [m.text for m in tg.sent_to(777)] == ["Let me think"]
            await channel.send(
                OutboundMessage("telegram", "777", "Let me think: 42.", reply_to="100", key="a-2")
            )
        assert [m.text for m in tg.sent_to(777)] == ["Let me think: 42."]
        assert len(tg.calls_to("sendMessage")) == 1


async def test_the_preview_of_another_question_is_left_alone(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg:
        await streamed_then_stopped(tg, tmp_path, "The answer is")
        async with running_channel(tg, tmp_path, streaming=True) as (channel, _):
            await channel.send(
                OutboundMessage("telegram", "777", "Another answer.", reply_to="200", key="a-3")
            )
        assert [m.text for m in tg.sent_to(777)] == ["The answer is", "Another answer."]
