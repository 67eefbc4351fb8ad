"""The hand-over takes each chat's updates in, in order, and chats side by side: a download Telegram's file
server holds back holds back only the chat that sent the file.

End to end: the real PTB against the fake Bot API, whose file server keeps a body back until the test
lets it go (``held``), so nothing here waits on a clock. Another chat's message reaching the dispatcher
while the download is held is the proof; a message sent after it in the same chat, and the sentinel
that follows, show the held chat keeps its order.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from channels.telegram.handover import lane_of
from channels.telegram.journal import JOURNAL_FILE
from tests.channels.telegram.kit import RecordingSink, running_channel
from tests.fakes.telegram_server import FakeTelegramServer

ALICE, BOB, CAROL = 42, 43, 44  # their private chats have the same ids
GROUP = -100123


def document(file_id: str, name: str = "notes.md") -> dict[str, Any]:
    return {
        "file_id": file_id,
        "file_unique_id": f"u{file_id}",
        "file_name": name,
        "mime_type": "text/markdown",
    }


def texts(sink: RecordingSink, chat: int) -> list[str]:
    return [m.text for m in sink.received if m.chat_id == str(chat)]


async def test_a_held_download_holds_back_no_other_chat_and_its_own_chat_keeps_its_order(
    tmp_path: Path,
) -> None:
    held = asyncio.Event()
    sink = RecordingSink(reply="got it")
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, sink, allowed_users=[str(ALICE), str(BOB)]),
    ):
        slow = tg.add_file(b"# notes\n", "documents/notes.md", held=held)
        try:
            tg.push_message(None, chat_id=ALICE, user_id=ALICE, document=document(slow), caption="read")
            await tg.wait_for(lambda: tg.files[slow].downloads == 1)  # Alice's message waits on its file
            tg.push_message("meanwhile", chat_id=BOB, user_id=BOB, first_name="Bob")
            [answer] = await tg.wait_for_messages(1, chat_id=BOB)  # answered while Alice's file is held
            assert answer.text == "got it"
            tg.push_message("and then", chat_id=ALICE, user_id=ALICE)
            tg.push_message("still here", chat_id=BOB, user_id=BOB, first_name="Bob")
            await sink.wait_until(lambda: len(texts(sink, BOB)) == 2)  # taken after Alice's second
            assert texts(sink, ALICE) == []  # her second message waits behind her first
        finally:
            held.set()
        answers = await tg.wait_for_messages(2, chat_id=ALICE)
    assert texts(sink, ALICE) == ["read", "and then"]
    [attachment] = next(m for m in sink.received if m.chat_id == str(ALICE)).attachments
    assert attachment.data == b"# notes\n"  # the held file was read once let go
    assert [a.text for a in answers] == ["got it", "got it"]


async def test_a_group_keeps_its_order_across_senders_while_one_of_them_waits_on_a_photo(
    tmp_path: Path,
) -> None:
    """The lane is the chat, not the sender: in a group, Bob's question after Alice's photo stays after it."""
    held = asyncio.Event()
    async with (
        FakeTelegramServer() as tg,
        running_channel(
            tg,
            tmp_path,
            vision=True,
            allowed_groups=[str(GROUP)],
            allowed_users=[str(CAROL)],
            require_mention=False,
        ) as (_, sink),
    ):
        slow = tg.add_file(b"\xff\xd8jpeg", "photos/cat.jpg", held=held)
        photo = [{"file_id": slow, "file_unique_id": "p1", "width": 90, "height": 90}]
        group = {"chat_id": GROUP, "chat_type": "supergroup"}
        try:
            tg.push_message(None, photo=photo, caption="what is this?", user_id=ALICE, **group)
            await tg.wait_for(lambda: tg.files[slow].downloads == 1)
            tg.push_message("a cat, surely", user_id=BOB, first_name="Bob", **group)
            tg.push_message("sentinel", chat_id=CAROL, user_id=CAROL, first_name="Carol")
            await sink.wait_until(lambda: texts(sink, CAROL) == ["sentinel"])
            assert texts(sink, GROUP) == []
        finally:
            held.set()
        await sink.wait_until(lambda: len(texts(sink, GROUP)) == 2)
    assert texts(sink, GROUP) == ["what is this?", "a cat, surely"]
    assert [a.data for a in sink.received[1].attachments] == [b"\xff\xd8jpeg"]


async def test_updates_held_from_an_earlier_run_are_taken_in_side_by_side_before_new_ones(
    tmp_path: Path,
) -> None:
    """Held updates of an earlier run come first, but among themselves a held download holds back only its
    chat; the message sent after the start follows once they are all taken in."""
    held = asyncio.Event()
    async with FakeTelegramServer() as tg:
        slow = tg.add_file(b"# notes\n", "documents/notes.md", held=held)
        earlier = [
            {"update_id": 9001, "message": tg.user_message(None, chat_id=ALICE, document=document(slow))},
            {"update_id": 9002, "message": tg.user_message("from before", chat_id=BOB, user_id=BOB)},
        ]
        (tmp_path / JOURNAL_FILE).write_text(json.dumps({"bot_id": tg.bot_user["id"], "held": earlier}))
        async with running_channel(tg, tmp_path, allowed_users=[str(ALICE), str(BOB), str(CAROL)]) as (
            _,
            sink,
        ):
            try:
                await sink.wait_until(lambda: texts(sink, BOB) == ["from before"])
                await tg.wait_for(lambda: tg.files[slow].downloads == 1)
                assert texts(sink, ALICE) == []
                tg.push_message("new", chat_id=CAROL, user_id=CAROL, first_name="Carol")
            finally:
                held.set()
            await sink.wait_until(lambda: len(sink.received) == 3)
        data = json.loads((tmp_path / JOURNAL_FILE).read_text())
    assert [m.text for m in sink.received[1:]] == ["", "new"]  # Alice's file, then the new message
    assert data["held"] == [] and {9001, 9002} <= set(data["done"])


@pytest.mark.parametrize(
    ("update", "lane"),
    [
        ({"update_id": 1, "message": {"chat": {"id": 7}}}, ("chat", 7)),
        ({"update_id": 2, "edited_message": {"chat": {"id": -5}}}, ("chat", -5)),
        ({"update_id": 3, "my_chat_member": {"chat": {"id": 8}, "from": {"id": 1}}}, ("chat", 8)),
        ({"update_id": 4, "callback_query": {"id": "q", "message": {"chat": {"id": 9}}}}, ("chat", 9)),
        ({"update_id": 5, "inline_query": {"id": "q", "query": "x"}}, ("update", 5)),
        ({"update_id": 6, "message": {"chat": {"id": "not a number"}}}, ("update", 6)),
    ],
)
def test_an_update_goes_to_its_chats_lane_or_one_of_its_own(
    update: dict[str, Any], lane: tuple[str, int]
) -> None:
    assert lane_of(update) == lane
