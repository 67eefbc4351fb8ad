"""Files users send on Telegram are read no further than their cap, whatever sizes Telegram states.

The Bot API's ``file_size`` is optional (in the message and in ``getFile``), and a self-hosted or
misbehaving server may state less than it sends. The real PTB fetches against the fake Bot API, which
can lie about sizes and send bodies without ``Content-Length``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from channels.telegram.media import MAX_IMAGE_BYTES
from tests.channels.telegram.kit import running_channel
from tests.fakes.telegram_server import FakeTelegramServer


def document(file_id: str, name: str, mime: str, size: int | None) -> dict[str, object]:
    found: dict[str, object] = {"file_id": file_id, "file_unique_id": f"u{file_id}", "file_name": name}
    found["mime_type"] = mime
    if size is not None:
        found["file_size"] = size
    return found


async def test_a_document_larger_than_stated_is_not_read_past_the_cap(tmp_path: Path) -> None:
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, max_document_bytes=100) as (_, sink),
    ):
        lying = tg.add_file(b"x" * 5000, "documents/lying.txt", file_size=17)
        tg.push_message(None, document=document(lying, "lying.txt", "text/plain", 17), caption="read this")
        [message] = await sink.wait_for(1)
    [kept] = message.attachments
    assert (kept.kind, kept.name, kept.data) == ("file", "lying.txt", b"")
    assert message.text.startswith("read this")
    assert "lying.txt is larger than 100 bytes, so it was not read." in message.text


async def test_a_chunked_body_of_no_stated_size_stops_at_the_cap(tmp_path: Path) -> None:
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, max_document_bytes=100) as (_, sink),
    ):
        endless = tg.add_file(b"y" * 2_000_000, "documents/endless.log", file_size=None, chunked=True)
        small = tg.add_file(b"fits\n", "documents/small.log", file_size=None, chunked=True)
        tg.push_message(None, document=document(endless, "endless.log", "text/plain", None), caption="hm")
        tg.push_message(None, document=document(small, "small.log", "text/plain", None))
        first, second = await sink.wait_for(2)
    assert [a.kind for a in first.attachments] == ["file"]
    assert first.text.startswith("hm") and "endless.log is larger than 100 bytes" in first.text
    [text] = second.attachments
    assert (text.kind, text.data) == ("text", b"fits\n")  # a body under the cap is read whole


async def test_a_photo_of_no_stated_size_stops_at_the_image_cap(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, vision=True) as (_, sink):
        big = tg.add_file(b"\xff\xd8" + b"z" * MAX_IMAGE_BYTES, "photos/big.jpg", file_size=None)
        photo = [{"file_id": big, "file_unique_id": "p1", "width": 9000, "height": 9000}]
        tg.push_message(None, photo=photo, caption="what is this?")
        [message] = await sink.wait_for(1)
    assert message.attachments == ()
    assert message.text.startswith("what is this?")
    assert f"larger than {MAX_IMAGE_BYTES} bytes" in message.text


async def test_an_image_document_larger_than_stated_is_not_read(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, vision=True) as (_, sink):
        body = b"\x89PNG" + b"z" * MAX_IMAGE_BYTES
        lying = tg.add_file(body, "documents/scan.png", file_size=12, chunked=True)
        tg.push_message(None, document=document(lying, "scan.png", "image/png", 12))
        [message] = await sink.wait_for(1)
    assert [(a.kind, a.data) for a in message.attachments] == [("file", b"")]
    assert f"scan.png is larger than {MAX_IMAGE_BYTES} bytes" in message.text


async def test_a_size_stated_by_get_file_over_the_cap_skips_the_download(tmp_path: Path) -> None:
    """The message may leave ``file_size`` out while ``getFile`` states it: then nothing is fetched."""
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, max_document_bytes=100) as (_, sink),
    ):
        big = tg.add_file(b"w" * 5000, "documents/big.md")
        tg.push_message(None, document=document(big, "big.md", "text/markdown", None))
        [message] = await sink.wait_for(1)
    assert "big.md is larger than 100 bytes" in message.text
    assert tg.files[big].served == 0


async def test_a_compressed_body_is_refused_not_inflated(tmp_path: Path) -> None:
    """The bot asks for no encoding; a server that compresses anyway could send a 5 KB gzip that
    inflates to 5 MB (or 5 GB) before any count sees it."""
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, max_document_bytes=100) as (_, sink),
    ):
        bomb = tg.add_file(b"x" * 5_000_000, "documents/bomb.txt", file_size=17, gzip=True)
        tg.push_message(None, document=document(bomb, "bomb.txt", "text/plain", 17), caption="open it")
        [message] = await sink.wait_for(1)
    assert [(a.kind, a.data) for a in message.attachments] == []
    assert message.text.startswith("open it") and "could not be downloaded" in message.text


async def test_a_download_the_file_server_fails_once_is_tried_again(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (_, sink):
        flaky = tg.add_file(b"# notes\n", "documents/flaky.md", failures=1)
        tg.push_message(None, document=document(flaky, "flaky.md", "text/markdown", 8))
        [message] = await sink.wait_for(1)
    [text] = message.attachments
    assert (text.kind, text.data) == ("text", b"# notes\n")


async def test_a_download_that_never_finishes_goes_on_with_a_note_at_its_deadline(tmp_path: Path) -> None:
    """A server that drips a byte now and then never trips a read timeout; the byte cap is far off. The
    whole download has a deadline (``telegram.download_timeout``), and the messages after it go on."""
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, download_timeout=0.5) as (_, sink),
    ):
        slow = tg.add_file(b"never ends\n", "documents/slow.txt", file_size=None, drip=0.01)
        tg.push_message(None, document=document(slow, "slow.txt", "text/plain", None), caption="read it")
        tg.push_message("and this")
        first, second = await sink.wait_for(2)
    assert [(a.kind, a.name, a.data) for a in first.attachments] == [("file", "slow.txt", b"")]
    assert first.text.startswith("read it")
    assert "slow.txt took longer than 0.5 seconds to download, so it was not read." in first.text
    assert second.text == "and this"


async def test_a_photo_that_never_finishes_goes_on_with_a_note_at_its_deadline(tmp_path: Path) -> None:
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, vision=True, download_timeout=0.5) as (_, sink),
    ):
        slow = tg.add_file(b"\xff\xd8\xff", "photos/slow.jpg", file_size=None, drip=0.01)
        photo = [{"file_id": slow, "file_unique_id": "p1", "width": 90, "height": 90}]
        tg.push_message(None, photo=photo, caption="what is this?")
        [message] = await sink.wait_for(1)
    assert message.attachments == ()
    assert message.text.startswith("what is this?")
    assert "photo took longer than 0.5 seconds to download" in message.text


@pytest.mark.parametrize(("cap", "said"), [(1_000_000, 1_000_000), (50_000_000, 20_000_000)])
async def test_a_file_the_bot_api_calls_too_big_gets_the_too_large_note(
    tmp_path: Path, cap: int, said: int
) -> None:
    """Over 20 MB, ``getFile`` answers "Bad Request: file is too big": the file is too large, not
    broken, and the note says so, with the smaller of the two limits (true whichever is lower)."""
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, max_document_bytes=cap) as (_, sink),
    ):
        huge = tg.add_file(b"h" * (20 * 1024 * 1024 + 1), "documents/huge.csv")
        tg.push_message(None, document=document(huge, "huge.csv", "text/csv", None), caption="sum it")
        [message] = await sink.wait_for(1)
    assert [(a.kind, a.name, a.data) for a in message.attachments] == [("file", "huge.csv", b"")]
    assert message.text.startswith("sum it")
    assert f"huge.csv is larger than {said} bytes, so it was not read." in message.text
    assert "could not be downloaded" not in message.text
    assert tg.files[huge].served == 0
