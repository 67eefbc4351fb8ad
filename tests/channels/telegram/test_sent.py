"""What Telegram already showed is not sent again when the same answer goes out once more.

Each test sends an answer (same key) from one channel, stops, and sends it again from a channel started
afresh on the same ``state/`` folder, as the next start after a kill does (``bot/recovery.py``).
"""

from __future__ import annotations

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
