"""Discord attachments are read no further than ``discord.max_attachment_bytes``, whatever size the
message states: the real discord.py against the fake Discord, whose CDN can send more than the stated
``size`` and send it without ``Content-Length``."""

from __future__ import annotations

import json
from pathlib import Path

from tests.channels.discord.test_channel import discord_world
from tests.fakes.discord_server import CdnFile

CAP = {"max_attachment_bytes": 1000}


async def test_a_text_file_larger_than_stated_is_not_read_past_the_cap(tmp_path: Path) -> None:
    async with discord_world(tmp_path, discord_settings=CAP) as w:
        lying = CdnFile("notes.txt", "text/plain", b"x" * 50_000, declared_size=10)
        await w.discord.user_message(
            channel_id=w.dm, author=w.alice, content="see attached", attachments=(lying,)
        )
        await w.discord.wait_for_bot_messages(w.dm)
    said = w.user_texts()[-1]
    assert "see attached" in said
    assert "notes.txt is larger than 1000 bytes, so it was not read." in said
    assert "xxxxxxxxxx" not in said


async def test_a_chunked_image_stops_at_the_cap(tmp_path: Path) -> None:
    async with discord_world(tmp_path, discord_settings=CAP) as w:
        flood = CdnFile("cat.png", "image/png", b"\x89PNG" + b"z" * 4_000_000, declared_size=12, chunked=True)
        small = CdnFile("ok.md", "text/markdown", b"# fits", declared_size=6, chunked=True)
        await w.discord.user_message(
            channel_id=w.dm, author=w.alice, content="look", attachments=(flood, small)
        )
        await w.discord.wait_for_bot_messages(w.dm)
    body = json.dumps(w.llm.requests[-1].body["messages"])
    assert "image_url" not in body
    assert "cat.png is larger than 1000 bytes" in body
    assert "# fits" in body  # a body under the cap is read whole


async def test_a_stated_size_over_the_cap_is_noted_and_never_fetched(tmp_path: Path) -> None:
    async with discord_world(tmp_path, discord_settings=CAP) as w:
        big = CdnFile("big.md", "text/markdown", b"w" * 5000)
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="", attachments=(big,))
        await w.discord.wait_for_bot_messages(w.dm)
    assert "big.md is larger than 1000 bytes" in w.user_texts()[-1]
    assert big.served == 0


async def test_a_compressed_body_is_refused_not_inflated(tmp_path: Path) -> None:
    """The bot asks for no encoding; a CDN that compresses anyway could send a 5 KB gzip that inflates
    to 5 MB (or 5 GB)."""
    async with discord_world(tmp_path, discord_settings=CAP) as w:
        bomb = CdnFile("bomb.txt", "text/plain", b"x" * 5_000_000, declared_size=10, gzip=True)
        await w.discord.user_message(channel_id=w.dm, author=w.alice, content="open it", attachments=(bomb,))
        await w.discord.wait_for_bot_messages(w.dm)
    said = w.user_texts()[-1]
    assert "open it" in said and "[file bomb.txt (text/plain, 10 bytes) received]" in said
    assert "xxxxxxxxxx" not in said


async def test_a_download_that_never_finishes_goes_on_with_a_note_at_its_deadline(tmp_path: Path) -> None:
    """A CDN that sends a byte now and then never trips a read timeout: the message would wait for as
    long as it kept on (aiohttp's own limit is 5 minutes)."""
    settings = {**CAP, "download_timeout": 0.5}
    async with discord_world(tmp_path, discord_settings=settings) as w:
        slow = CdnFile("slow.txt", "text/plain", b"abc", drip=0.05)
        later = CdnFile("later.md", "text/markdown", b"never reached", drip=0.05)
        await w.discord.user_message(
            channel_id=w.dm, author=w.alice, content="read this", attachments=(slow, later)
        )
        await w.discord.wait_for_bot_messages(w.dm)
    said = w.user_texts()[-1]
    assert "read this" in said
    # One deadline for the message's files together: the second is not given another 0.5 s.
    assert "slow.txt took longer than 0.5 seconds to download, so it was not read." in said
    assert "later.md took longer than 0.5 seconds to download, so it was not read." in said
