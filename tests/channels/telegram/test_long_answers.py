"""Long answers as a Telegram user sees them: every part of a split answer renders on its own.

The real PTB sends to the fake Bot API, which parses the HTML and measures what it shows the way
Telegram does; the tests read what the chat would show.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.channels.telegram.kit import RecordingSink, running_channel
from tests.fakes.telegram_server import FakeTelegramServer, Sent, utf16_len


async def _answer(tmp_path: Path, reply: str, parts: int) -> list[Sent]:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, RecordingSink(reply=reply)) as _:
        tg.push_message("go on")
        await tg.wait_for_messages(parts)
        await asyncio.sleep(0.2)  # a part too many would be in by now
        sent = tg.sent_to(777)
    assert len(tg.calls_to("sendMessage")) == len(sent), "the fake refused nothing"
    assert all(utf16_len(m.text) <= 4096 for m in sent)
    return sent


async def test_a_table_longer_than_a_message_is_aligned_in_every_part(tmp_path: Path) -> None:
    """A table that spans parts: the second part used to show the raw Markdown rows ("| row 107 |
    ..."), as markdown-it saw no table without its header and rule line."""
    rows = "\n".join(f"| row {i} | value {i} with *some* words |" for i in range(200))
    reply = f"Here it is:\n\n| name | value |\n|---|---|\n{rows}\n\nThat's all."
    sent = await _answer(tmp_path, reply, 2)
    assert all(m.parse_mode == "HTML" for m in sent)
    shown = "\n".join(m.text for m in sent)
    assert "| row" not in shown and "*some*" not in shown, "no raw Markdown row"
    for i in range(200):
        assert f"row {i:<3} | value {i} with some words" in shown
    assert sum("<pre>" in m.raw for m in sent) >= 2
    assert sent[0].text.startswith("Here it is:") and sent[-1].text.endswith("That's all.")


async def test_a_line_too_long_for_a_message_is_not_cut_inside_a_link_or_bold(tmp_path: Path) -> None:
    """One line (no newline) longer than a message is cut at a space; a cut inside "[a link](url)" or
    "**bold words**" showed the raw Markdown halves in two messages."""
    reply = (
        ("word " * 815)
        + "**bold words across a cut** and [a link with words](https://example.com/x) "
        + ("more " * 900)
    )
    sent = await _answer(tmp_path, reply, 2)
    assert all(m.parse_mode == "HTML" for m in sent)
    shown = "\n".join(m.text for m in sent)
    assert "**" not in shown and "](" not in shown and "[a link" not in shown
    assert any("<b>bold words across a cut</b>" in m.raw for m in sent)
    assert any('<a href="https://example.com/x">a link with words</a>' in m.raw for m in sent)
    assert (
        shown.split()
        == reply.replace("**", "").replace("[", "").replace("](https://example.com/x)", "").split()
    )
