"""The Telegram update journal on its own: durable, bounded, deduplicating (channels/telegram/journal.py)."""

from __future__ import annotations

import asyncio
import errno
import json
from pathlib import Path
from typing import Any

import pytest

from bot.admin import health_report
from bot.errors import StorageError
from bot.ports import ChannelHealth
from channels.outage import StorageOutage
from channels.telegram.handover import HandOver
from channels.telegram.journal import JOURNAL_FILE, UpdateJournal
from tests.channels.telegram.kit import all_taken_in, break_folder


def update(update_id: int, text: str = "hi") -> dict[str, Any]:
    return {"update_id": update_id, "message": {"message_id": update_id, "text": text}}


def set_aside(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"{JOURNAL_FILE}.damaged-*"))


def on_disk(state: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((state / JOURNAL_FILE).read_text())
    return data


async def test_accepted_updates_survive_a_restart_and_come_out_again_in_order(tmp_path: Path) -> None:
    journal = UpdateJournal(tmp_path / JOURNAL_FILE)
    await journal.load(bot_id=4242)
    assert await journal.accept([update(5), update(6), update(7)]) == 3
    await journal.release([6])
    # a new process: 5 and 7 were never handed over
    again = UpdateJournal(tmp_path / JOURNAL_FILE)
    assert await again.load(bot_id=4242) == 2
    assert [(await again.next())["update_id"] for _ in range(2)] == [5, 7]
    assert await again.accept([update(5), update(6), update(7), update(8)]) == 1  # redeliveries skipped
    assert (tmp_path / JOURNAL_FILE).stat().st_mode & 0o777 == 0o600


async def test_done_ids_are_bounded_and_a_lower_random_id_is_still_new(tmp_path: Path) -> None:
    journal = UpdateJournal(tmp_path / JOURNAL_FILE, done_limit=100)
    await journal.load(bot_id=1)
    for first in range(1000, 1500, 50):
        batch = [update(i) for i in range(first, first + 50)]
        await journal.accept(batch)
        await journal.release(u["update_id"] for u in batch)
    data = on_disk(tmp_path)
    assert data["held"] == [] and data["done"] == list(range(1400, 1500))  # the newest 100
    # After a week without updates Telegram picks the next id at random: no "below X is done" rule.
    assert await journal.accept([update(7)]) == 1


async def test_another_bots_ids_are_forgotten_but_its_held_messages_are_not(tmp_path: Path) -> None:
    journal = UpdateJournal(tmp_path / JOURNAL_FILE)
    await journal.load(bot_id=1)
    await journal.accept([update(1), update(2)])
    await journal.release([1])
    other = UpdateJournal(tmp_path / JOURNAL_FILE)
    assert await other.load(bot_id=2) == 1
    assert not other.knows(1) and other.knows(2)


async def test_a_full_journal_refuses_new_updates_until_one_is_released(tmp_path: Path) -> None:
    journal = UpdateJournal(tmp_path / JOURNAL_FILE, held_limit=2)
    await journal.load(bot_id=1)
    await journal.accept([update(1), update(2)])
    assert journal.full
    with pytest.raises(StorageError, match="wait to be handed over"):
        await journal.accept([update(3)])
    assert await journal.accept([update(2)]) == 0  # a redelivery is fine even when full
    room = asyncio.create_task(journal.room())
    await asyncio.sleep(0)
    assert not room.done()
    await journal.release([1])
    async with asyncio.timeout(1):
        await room
    assert await journal.accept([update(3)]) == 1


async def test_an_update_that_could_not_be_stored_is_not_kept(tmp_path: Path) -> None:
    state = tmp_path / "state"
    journal = UpdateJournal(state / JOURNAL_FILE)
    await journal.load(bot_id=1)
    repair = break_folder(state)
    with pytest.raises(NotADirectoryError):
        await journal.accept([update(1)])
    assert not journal.knows(1) and journal.held == 0  # so its redelivery is taken, not skipped
    repair()
    assert await journal.accept([update(1)]) == 1
    assert [u["update_id"] for u in on_disk(state)["held"]] == [1]


async def test_a_release_that_could_not_be_saved_is_saved_when_storage_returns(tmp_path: Path) -> None:

    state = tmp_path / "state"
    journal = UpdateJournal(state / JOURNAL_FILE, outage=StorageOutage("j", first_delay=0.01, max_delay=0.05))
    await journal.load(bot_id=1)
    await journal.accept([update(1)])
    repair = break_folder(state)
    await journal.release([1])  # does not raise: the message is with the dispatcher already
    repair()
    async with asyncio.timeout(5):
        while on_disk(state)["held"]:
            await asyncio.sleep(0.01)
    assert on_disk(state)["done"] == [1]
    await journal.close()


@pytest.mark.parametrize("damage", [b'{"held": [{"update_id": 1, "mess', b'{"held": [], "x": "\xff\xfe"}'])
async def test_a_damaged_journal_is_kept_aside_and_a_fresh_one_started(tmp_path: Path, damage: bytes) -> None:
    (tmp_path / JOURNAL_FILE).write_bytes(damage)  # torn, or holding a byte that is not UTF-8
    journal = UpdateJournal(tmp_path / JOURNAL_FILE)
    assert await journal.load(bot_id=1) == 0
    [kept] = set_aside(tmp_path)
    assert kept.read_bytes() == damage


async def test_a_second_damaged_journal_does_not_replace_the_first_kept_aside(tmp_path: Path) -> None:
    for damage in (b'{"held": [{"upd', b'{"held": [{"update_id": 2, "mess'):
        (tmp_path / JOURNAL_FILE).write_bytes(damage)
        assert await UpdateJournal(tmp_path / JOURNAL_FILE).load(bot_id=1) == 0
    assert sorted(p.read_bytes() for p in set_aside(tmp_path)) == [
        b'{"held": [{"upd',
        b'{"held": [{"update_id": 2, "mess',
    ]


async def test_a_bad_entry_costs_only_itself_and_a_bad_done_list_does_not_stop_the_start(
    tmp_path: Path,
) -> None:
    document = {"bot_id": 1, "held": [update(5), 7, {"update_id": "x"}, update(6)], "done": 3}
    (tmp_path / JOURNAL_FILE).write_text(json.dumps(document))
    journal = UpdateJournal(tmp_path / JOURNAL_FILE)
    assert await journal.load(bot_id=1) == 2  # updates 5 and 6 are taken in again
    assert [(await journal.next())["update_id"] for _ in range(2)] == [5, 6]
    [kept] = set_aside(tmp_path)
    assert kept.read_bytes() == b'7\n{"update_id": "x"}\n{"done": 3}\n'


async def test_a_held_update_listed_twice_is_counted_once_and_the_start_does_not_wait_for_a_new_one(
    tmp_path: Path,
) -> None:
    """load() queues each held update once; it returned the file's count, so the hand-over waited for one
    more update (a new one, after the start) before it called resumed_done."""
    document = {"bot_id": 1, "held": [update(5), update(6), update(5)], "done": []}
    (tmp_path / JOURNAL_FILE).write_text(json.dumps(document))
    journal = UpdateJournal(tmp_path / JOURNAL_FILE)
    resumed = await journal.load(bot_id=1)
    assert resumed == 2
    taken: list[int] = []
    done = asyncio.Event()

    async def intake(data: dict[str, Any]) -> None:
        taken.append(data["update_id"])

    outage = StorageOutage("x")
    handover = HandOver(
        journal, intake, outage=outage, max_attempts=3, resumed=resumed, resumed_done=done.set
    )
    running = asyncio.create_task(handover.run())
    try:
        async with asyncio.timeout(10):  # (a guard: with no new update, a wrong count waits for ever)
            await done.wait()
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert sorted(taken) == [5, 6]


async def test_an_unreadable_journal_stops_the_start_with_a_clear_error(tmp_path: Path) -> None:
    state = tmp_path / "state"
    break_folder(state)
    with pytest.raises(StorageError, match=r"cannot read .*telegram_updates\.json"):
        await UpdateJournal(state / JOURNAL_FILE).load(bot_id=1)


async def test_an_update_given_up_after_a_storage_failure_leaves_the_health_check_clear(
    tmp_path: Path,
) -> None:
    """Its intake was refused by storage once, then failed for another reason until it was dropped:
    nothing waits for storage any more, yet /healthz named "taking Telegram messages in" (503) until some
    later message of any chat went through, in a quiet bot for good."""
    journal = UpdateJournal(tmp_path / JOURNAL_FILE)
    await journal.load(bot_id=1)
    await journal.accept([update(1)])
    health = ChannelHealth(state="running")
    outage = StorageOutage("taking Telegram messages in", first_delay=0.01, health=health)
    tries: list[str] = []

    async def intake(data: dict[str, Any]) -> None:
        tries.append("storage" if not tries else "bug")
        if len(tries) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        raise ValueError("a message this intake cannot take")

    handover = HandOver(journal, intake, outage=outage, max_attempts=3)
    running = asyncio.create_task(handover.run())
    try:
        await all_taken_in(tmp_path)  # dropped: released from the journal
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert tries == ["storage", "bug", "bug"]  # (its tries count the one storage refused)
    assert health.storage_errors == {}
    status, body = health_report({"telegram": health}, None, uptime=1.0)
    assert status == 200 and body["storage"] == {"ok": True, "failing": {}}
