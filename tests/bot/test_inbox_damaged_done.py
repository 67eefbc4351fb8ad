"""A damaged line inside an inbox file (not a torn tail): its message's answer is never sent twice,
and a message that really was pending is still answered (bot/inbox_file.py, ``_done_by_damage``).

Each test writes the file through a real dispatcher or inbox, damages one line as a disk would (bytes
flipped), and starts a dispatcher over it as ``membot run`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from bot.domain import InboundMessage
from bot.inbox import Inbox
from bot.outbox import PendingReply
from pipeline import Turn
from tests.bot.test_dispatcher import ModelSystem
from tests.bot.test_dispatcher_recovery import build, msg, settled, started


class HangsOn(ModelSystem):
    """Answers every message but ``text``, on which the turn hangs until it is cut (a kill)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.hanging = asyncio.Event()

    async def process(self, turn: Turn) -> None:
        if turn.user_text == self.text:
            self.hanging.set()
            await asyncio.Event().wait()
        await super().process(turn)


async def two_answered_and_one_cut(tmp_path: Path) -> Path:
    """Messages "one" and "two" answered (each its own turn), "three" cut mid-turn; returns the inbox file:
    the three accept lines, then the done marks of "one" and "two"."""
    model = HangsOn("three")
    model.gate = asyncio.Event()
    dispatcher, channel, _ = build(tmp_path, model, mode="per_message")
    await dispatcher.recover()
    dispatcher.attach(channel)
    for text in ("one", "two", "three"):
        await dispatcher.submit(msg(text, message_id=text))
    model.gate.set()
    await model.hanging.wait()  # "two"'s done mark is written before "three"'s turn begins
    await dispatcher.close(grace=0)
    assert [m.text for m in channel.sent] == ["answer to one", "answer to two"]
    [path] = (tmp_path / "inbox").glob("*.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    assert [line.startswith(b'{"done"') for line in lines] == [False, False, False, True, True]
    return path


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


def damage(path: Path, index: int, damaged: bytes) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    lines[index] = damaged
    path.write_bytes(b"".join(lines))


async def answered_after_restart(tmp_path: Path) -> list[str]:
    model = ModelSystem()
    dispatcher, channel, _ = await started(tmp_path, model, mode="per_message")
    await settled(tmp_path)
    await dispatcher.close(grace=1)
    return [m.text for m in channel.sent]


@pytest.mark.parametrize(
    "flip",
    [
        pytest.param(lambda line: b"\x00" * (len(line) - 1) + b"\n", id="beyond recognition"),
        pytest.param(lambda line: line.replace(b'"reply"', b'"r\xffply"'), id="still a done mark"),
    ],
)
async def test_a_damaged_done_mark_followed_by_a_later_answer_does_not_send_its_answer_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, flip: Callable[[bytes], bytes]
) -> None:
    path = await two_answered_and_one_cut(tmp_path)
    bad = flip(path.read_bytes().splitlines(keepends=True)[3])  # "one"'s done mark
    damage(path, 3, bad)

    assert await answered_after_restart(tmp_path) == ["answer to three"]  # not "answer to one" again
    decided, *again = logged(caplog, "inbox_damaged_done_mark")  # (each read of the file says so)
    assert len(decided["entries"]) == 1 and "not answered again" in decided["decided"]
    assert all(line["entries"] == decided["entries"] for line in again)
    [aside] = (tmp_path / "inbox").glob("*.damaged-*")
    assert str(aside) == decided["damaged_lines_in"] and aside.read_bytes() == bad  # kept, as any damage


async def test_a_damaged_done_mark_at_the_end_still_naming_its_message_is_not_answered_again(
    tmp_path: Path,
) -> None:
    """No later line vouches for it, but its bytes still read as the done mark of "one"."""
    path = await two_answered_and_one_cut(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    torn = lines[3].replace(b'"reply"', b'"r\xffply"')
    path.write_bytes(b"".join(lines[:3]) + torn)  # and "two"'s done mark never written
    assert sorted(await answered_after_restart(tmp_path)) == ["answer to three", "answer to two"]


async def unfinished(tmp_path: Path, texts: Sequence[str], *, done: Sequence[str] = ()) -> Path:
    """An inbox file of ``texts`` accepted in order, then ``done``'s done marks, as a kill left it."""
    inbox = Inbox(tmp_path / "inbox")
    await inbox.load_pending()
    ids: dict[str, str] = {}
    for text in texts:
        ids[text], written = inbox.add(msg(text, message_id=text))
        await written
    for text in done:
        await inbox.finish("test:c1", {ids[text]})
    [path] = (tmp_path / "inbox").glob("*.jsonl")
    return path


async def test_pending_messages_behind_a_damaged_line_with_no_later_answer_are_all_answered(
    tmp_path: Path,
) -> None:
    """Nothing after the damaged line was finished: nothing vouches that "one" was, so it is answered."""
    path = await unfinished(tmp_path, ["one", "two", "three"])
    damage(path, 1, b"\x00" * 40 + b"\n")  # "two"'s accept line, beyond recognition: it alone is lost
    assert sorted(await answered_after_restart(tmp_path)) == ["answer to one", "answer to three"]


async def test_a_damaged_line_that_still_reads_as_an_accept_line_finished_nothing(tmp_path: Path) -> None:
    """Message "one" pending past "three"'s answer (a turn that crashed on a bug, say): the damaged line between
    them was "two"'s accept line, its bytes say so, so it is no done mark of "one"."""
    path = await unfinished(tmp_path, ["one", "two", "three", "four"], done=["three"])
    lines = path.read_bytes().splitlines(keepends=True)
    damage(path, 1, lines[1].replace(b'"text": "two"', b'"text": "t\xffo"'))
    assert sorted(await answered_after_restart(tmp_path)) == ["answer to four", "answer to one"]


async def test_a_message_whose_answer_is_kept_unsent_is_never_taken_as_done(tmp_path: Path) -> None:
    """An answer the platform refused is kept in the inbox for the next start, and its message stays
    pending while a later message is answered: damage between them must not cost the kept answer."""
    inbox = Inbox(tmp_path)
    first, written = inbox.add(InboundMessage("tg", "1", "u", "one", message_id="one"))
    await written
    second, written = inbox.add(InboundMessage("tg", "1", "u", "two", message_id="two"))
    await written
    await inbox.keep(PendingReply("tg", "1", "answer to one", (first,)))
    path = inbox.file("tg:1")
    with path.open("ab") as file:
        file.write(b'{"x\xff\xfe garbled beyond recognition\n')  # a damaged line of unknown kind
    await inbox.finish("tg:1", {second}, reply="r2")

    again = Inbox(tmp_path)
    assert [entry.message.text for entry in await again.load_pending()] == ["one"]
    assert [reply.text for reply in again.kept_replies("tg:1")] == ["answer to one"]
