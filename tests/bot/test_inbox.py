"""The inbox journal: arrival order on disk, group commit, and cuts that never drop a later arrival."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.domain import InboundMessage
from bot.inbox import Inbox


def message(text: str, chat: str = "c1") -> InboundMessage:
    return InboundMessage("test", chat, "u1", text)


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every fsync the process makes (the real one still runs)."""
    seen: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        seen.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    yield seen


async def reloaded(folder: Path) -> list[str]:
    return [entry.message.text for entry in await Inbox(folder).load_pending()]


async def test_a_burst_reaches_the_file_in_arrival_order_with_shared_fsyncs(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    inbox = Inbox(tmp_path)
    await inbox.load_pending()
    texts = [f"m{i}" for i in range(30)]
    added = [inbox.add(message(t, chat="c1" if i % 3 else "c2")) for i, t in enumerate(texts)]
    await asyncio.gather(*(durable for _, durable in added))
    again = await Inbox(tmp_path).load_pending()
    for chat in ("c1", "c2"):
        expected = [t for i, t in enumerate(texts) if (chat == "c1") == bool(i % 3)]
        assert [e.message.text for e in again if e.message.chat_id == chat] == expected
    assert len(fsyncs) < len(texts) // 3  # one per file per group, not one per message


async def test_a_done_mark_does_not_wait_behind_each_arrival_in_turn(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    inbox = Inbox(tmp_path)
    await inbox.load_pending()
    first, durable = inbox.add(message("answered"))
    await durable
    before = len(fsyncs)
    burst = [inbox.add(message(f"later {i}"))[1] for i in range(20)]
    await asyncio.sleep(0)  # the burst's writes are under way
    await inbox.finish("test:c1", {first}, reply="r1")
    assert len(fsyncs) - before <= 3  # the burst's group, then the done mark's: not 20 fsyncs first
    await asyncio.gather(*burst)
    assert await reloaded(tmp_path) == [f"later {i}" for i in range(20)]


async def test_a_message_arriving_while_the_file_is_cut_is_kept(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path)
    await inbox.load_pending()
    first, durable = inbox.add(message("answered"))
    await durable
    finishing = asyncio.create_task(inbox.finish("test:c1", {first}, reply="r1"))
    await asyncio.sleep(0)  # the done mark is queued; nothing is pending, so the file will be cut
    late, late_durable = inbox.add(message("arrived during the cut"))
    await asyncio.gather(finishing, late_durable)
    assert await reloaded(tmp_path) == ["arrived during the cut"]
    await inbox.finish("test:c1", {late})
    assert await reloaded(tmp_path) == []


def found(folder: Path, pattern: str) -> list[Path]:
    return sorted(folder.glob(pattern))


DAMAGE = {
    "torn json": b'{"entry":"x","message":{"tex',
    "invalid utf-8": b'{"entry":"x","message":"\xff"}',
    "not a record": b'{"entry":"x","message":[1]}',
    "number out of range": (
        b'{"entry":"x","message":{"channel":"test","chat_id":"c1","sender_id":"u1","text":"hi",'
        b'"ts":"2026-01-01T00:00:00+00:00","attachments":[{"kind":"file","name":"a","mime_type":"x",'
        b'"size":Infinity}]}}'
    ),
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
async def test_a_damaged_line_costs_only_itself_and_is_kept_aside_before_the_cut(
    tmp_path: Path, damage: bytes
) -> None:
    inbox = Inbox(tmp_path)
    await inbox.load_pending()
    added = [inbox.add(message(text)) for text in ("one", "two", "three")]
    await asyncio.gather(*(durable for _, durable in added))
    [path] = found(tmp_path, "*.jsonl")
    lines = path.read_bytes().split(b"\n")
    lines[1] = damage
    path.write_bytes(b"\n".join(lines))

    again = Inbox(tmp_path)
    assert [e.message.text for e in await again.load_pending()] == ["one", "three"]
    await again.finish("test:c1", set(again.pending_ids("test:c1")))
    assert path.read_bytes() == b""  # nothing pending: the file is cut, as before
    [kept] = found(tmp_path, "*.jsonl.damaged-*")
    assert kept.read_bytes() == damage + b"\n"


async def test_a_platforms_date_is_still_the_platforms_after_a_restart(tmp_path: Path) -> None:
    """(A clock days behind gives way to a platform's date only: bot/intake.py.)"""
    inbox = Inbox(tmp_path)
    await inbox.load_pending()
    for dated_by_platform in (True, False):
        _, durable = inbox.add(InboundMessage("test", "c1", "u1", "hi", platform_date=dated_by_platform))
        await durable
    again = await Inbox(tmp_path).load_pending()
    assert [entry.message.platform_date for entry in again] == [True, False]
