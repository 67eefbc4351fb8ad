"""Pending consolidations: a start after a kill finishes a consolidation once, never twice.

The kill is simulated the way it falls: the steps a retirement takes are run up to a write, and the
ones after it are not (see bot/memory/retirement.py, ``_record`` and ``_finish``).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.config import MemorySettings
from bot.domain import Message, Role
from bot.errors import StorageError
from bot.llm import LLMClient
from bot.memory import Layer, MemoryService
from bot.memory.archive import TranscriptArchive
from bot.memory.pending import PendingConsolidations, PendingWork, Plan
from tests.bot.memory.conftest import Clock
from tests.fakes.llm_server import FakeLLMServer, FakeReply

ENTRY = "We planned the Lisbon trip."
FACT = "User flies to Lisbon on May 3rd"
ANSWER = json.dumps(
    {
        "history_entry": ENTRY,
        "memory_update": f"- {FACT}\n",
        "items": [{"type": "fact", "content": FACT, "confidence": 0.9}],
    }
)


async def running_bot(root: Path, clock: Clock, llm: LLMClient) -> MemoryService:
    """The memory of ``membot run`` (``maintain_every`` set): its start resumes pending work."""
    memory = MemoryService(
        root / "memory",
        MemorySettings(),
        timezone="UTC",
        llm=llm,
        clock=clock,
        maintain_every=timedelta(days=1),
    )
    await memory.start()
    return memory


def talk(clock: Clock) -> list[Message]:
    return [
        Message(Role.USER if i % 2 == 0 else Role.ASSISTANT, f"Lisbon trip, part {i}", timestamp=clock.now)
        for i in range(4)
    ]


async def retiring(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> tuple[MemoryService, PendingConsolidations, list[Message], PendingWork]:
    """The running bot's memory with a retirement recorded and archived, its model answer scripted: the
    steps a retirement takes up to the consolidation."""
    memory = await running_bot(tmp_path, clock, llm)
    pending = PendingConsolidations(memory.root / "pending")
    messages = talk(clock)
    work = await pending.add("cli:me", messages, clock.now)
    await memory.archive.append("cli:me", messages, clock.now)
    fake_llm.script(FakeReply(text=ANSWER))
    return memory, pending, messages, work


async def test_a_kill_after_the_history_entry_writes_the_rest_once_at_the_next_start(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    memory, pending, messages, work = await retiring(tmp_path, clock, llm, fake_llm)
    root = memory.root
    plans: list[Plan] = []
    kept = tmp_path / "record"

    async def journal(plan: Plan) -> None:
        plans.append(plan)
        await pending.planned(work, plan)
        if len(plans) == 1:  # the plan, journaled before any of it is written
            await asyncio.to_thread(shutil.copytree, root / "pending", kept)

    await memory.consolidator.run("cli:me", messages, timeout=5, journal=journal)
    # Killed here, after the HISTORY.md append and before the month file's (it made the file), so
    # before MEMORY.md and every journal after the plan: the facts were not stored, the record stays.
    month = root / "HISTORY-2024-05.md"
    month.unlink()
    (root / "MEMORY.md").unlink()
    shutil.rmtree(root / "pending")
    shutil.copytree(kept, root / "pending")
    assert plans and [i for i in memory.items.items() if i.content == FACT] == []

    restarted = await running_bot(tmp_path, clock, llm)
    await restarted.close()
    assert len(fake_llm.requests) == 1  # the plan was written, not asked for again
    assert (root / "HISTORY.md").read_text().count(ENTRY) == 1
    assert month.read_text().count(ENTRY) == 1
    assert (root / "MEMORY.md").read_text() == f"- {FACT}\n"
    (fact,) = [i for i in restarted.items.items(Layer.EPISODIC) if i.content == FACT]
    assert list((root / "pending").iterdir()) == []

    # Killed again, after every write of the resumed run but before any of its journals and before its
    # record went: nothing twice.
    shutil.rmtree(root / "pending")
    shutil.copytree(kept, root / "pending")
    again = await running_bot(tmp_path, clock, llm)
    await again.close()
    assert len(fake_llm.requests) == 1
    assert (root / "HISTORY.md").read_text().count(ENTRY) == 1 and month.read_text().count(ENTRY) == 1
    assert (root / "MEMORY.md").read_text() == f"- {FACT}\n"
    assert [i for i in again.items.items(Layer.EPISODIC) if i.content == FACT] == [fact]
    assert len(await again.archive.read("cli:me")) == 4
    assert list((root / "pending").iterdir()) == []


async def test_a_kill_before_the_archive_append_archives_and_consolidates_at_the_next_start(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    """The record was written; the archive append and the session's save were not: the next start
    archives and consolidates the messages, and the session's next trim of them adds nothing."""
    memory = await running_bot(tmp_path, clock, llm)
    messages = talk(clock)
    await PendingConsolidations(memory.root / "pending").add("cli:me", messages, clock.now)
    # Killed here.
    fake_llm.script(FakeReply(text=ANSWER))
    restarted = await running_bot(tmp_path, clock, llm)
    assert await restarted.consolidate_in_background("cli:me", messages) is None  # the session's trim
    await restarted.close()
    assert [m.id for m in await restarted.archive.read("cli:me")] == [m.id for m in messages]
    assert (memory.root / "HISTORY.md").read_text().count(ENTRY) == 1
    assert len(fake_llm.requests) == 1


async def test_operator_commands_leave_pending_work_to_the_bot(
    tmp_path: Path, clock: Clock, fake_llm: FakeLLMServer
) -> None:
    memory = MemoryService(tmp_path / "memory", MemorySettings(), timezone="UTC", clock=clock)
    await PendingConsolidations(memory.root / "pending").add("cli:me", talk(clock), clock.now)
    await memory.start()
    await memory.close()
    assert not (memory.root / "HISTORY.md").exists()
    assert len(list((memory.root / "pending").iterdir())) == 1


async def test_a_damaged_record_is_kept_aside_once_and_the_others_resume(
    tmp_path: Path, clock: Clock
) -> None:
    pending = PendingConsolidations(tmp_path / "pending")
    good = await pending.add("terminal:me", talk(clock), clock.now)
    torn = tmp_path / "pending" / "20000101T000000000000-torn.json"
    torn.write_bytes(b'{"id": "torn", "session_id": "terminal:me", "messa')  # cut by a power loss

    assert [w.id for w in await pending.load()] == [good.id]
    [kept] = (tmp_path / "pending").glob("*.damaged-*")
    assert kept.read_bytes().startswith(b'{"id": "torn"') and not torn.exists()
    assert [w.id for w in await pending.load()] == [good.id]  # read once, not reported at every start


MOVED = "- User flies to Lisbon on May 4th"  # the operator's correction of FACT, made while the bot was down


async def killed_after_the_memory_write(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer, *, journaled: bool
) -> Path:
    """Run a consolidation whose MEMORY.md write is done, and stop before its facts and the record's
    removal; ``journaled`` False also loses the journal of that write (a kill right after the write)."""
    memory, pending, messages, work = await retiring(tmp_path, clock, llm, fake_llm)
    root = memory.root
    before_write = tmp_path / "record"
    plans: list[Plan] = []

    async def journal(plan: Plan) -> None:
        await pending.planned(work, plan)
        plans.append(plan)
        if len(plans) == 1:  # the plan, journaled before any of it is written
            await asyncio.to_thread(shutil.copytree, root / "pending", before_write)

    await memory.consolidator.run("cli:me", messages, timeout=5, journal=journal)
    if not journaled:
        shutil.rmtree(root / "pending")
        shutil.copytree(before_write, root / "pending")
    assert (root / "MEMORY.md").read_text() == f"- {FACT}\n"
    return root


@pytest.mark.parametrize("journaled", [True, False], ids=["write journaled", "killed before its journal"])
async def test_an_operator_edit_made_while_the_bot_was_down_survives_the_resume(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer, journaled: bool
) -> None:
    """MEMORY.md was written before the kill; the operator corrected it before the next start, which
    must not bring the bot's line back beside the correction."""
    root = await killed_after_the_memory_write(tmp_path, clock, llm, fake_llm, journaled=journaled)
    (root / "MEMORY.md").write_text(f"{MOVED}\n")

    restarted = await running_bot(tmp_path, clock, llm)
    await restarted.close()
    assert len(fake_llm.requests) == 1
    assert (root / "MEMORY.md").read_text() == f"{MOVED}\n"
    assert (root / "HISTORY.md").read_text().count(ENTRY) == 1
    assert list((root / "pending").iterdir()) == []


CORRECTED = "We planned the Porto trip."  # the operator's correction of ENTRY, made while the bot was down


@pytest.mark.parametrize("journaled", [True, False], ids=["write journaled", "killed before its journal"])
async def test_an_operator_edit_of_the_history_entry_made_while_the_bot_was_down_survives_the_resume(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer, journaled: bool
) -> None:
    """HISTORY.md got its entry before the kill; the operator corrected it before the next start, which
    must not append the bot's wording again beside the correction."""
    root = await killed_after_the_memory_write(tmp_path, clock, llm, fake_llm, journaled=journaled)
    history = root / "HISTORY.md"
    history.write_text(history.read_text().replace(ENTRY, CORRECTED))

    restarted = await running_bot(tmp_path, clock, llm)
    await restarted.close()
    assert len(fake_llm.requests) == 1
    text = history.read_text()
    assert ENTRY not in text and text.count(CORRECTED) == 1
    assert (root / "HISTORY-2024-05.md").read_text().count(ENTRY) == 1
    assert list((root / "pending").iterdir()) == []


class FullArchiveDisk:
    """Writes under ``memory/archive/`` fail with ENOSPC while ``full``: the disk fills up between a
    retirement's pending record and its archive append (at the system call: our code runs as it would)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        real = os.write

        def write(fd: int, data: Any) -> int:
            if self.full and "/memory/archive/" in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data)

        monkeypatch.setattr(os, "write", write)


async def test_a_failed_archive_append_leaves_no_record_to_consolidate_again(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trim fails (the messages stay in the session), the next trim retires them again, and the
    next start finds nothing left to do."""
    disk = FullArchiveDisk(monkeypatch)
    memory = await running_bot(tmp_path, clock, llm)
    root = memory.root
    messages = talk(clock)
    disk.full = True
    with pytest.raises(OSError, match="No space"):
        await memory.consolidate_in_background("cli:me", messages)
    assert list((root / "pending").iterdir()) == []
    disk.full = False
    fake_llm.script(FakeReply(text=ANSWER))
    task = await memory.consolidate_in_background("cli:me", messages)  # the next turn's trim
    assert task is not None
    await task
    await memory.close()

    restarted = await running_bot(tmp_path, clock, llm)
    await restarted.close()
    assert len(fake_llm.requests) == 1
    assert (root / "HISTORY.md").read_text().count(ENTRY) == 1


async def test_a_record_whose_messages_a_later_retirement_took_is_dropped(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    """A record left without its archive append (its removal failed too) while the bot ran on: the
    session's next trim retires the messages again, and they are consolidated by that one only."""
    memory = await running_bot(tmp_path, clock, llm)
    root = memory.root
    messages = talk(clock)
    await PendingConsolidations(root / "pending").add("cli:me", messages[:3], clock.now)
    clock.advance(seconds=1)
    fake_llm.script(FakeReply(text=ANSWER))
    task = await memory.consolidate_in_background("cli:me", messages)
    assert task is not None
    await task
    await memory.close()
    assert list((root / "pending").iterdir()) == []

    restarted = await running_bot(tmp_path, clock, llm)
    await restarted.close()
    assert len(fake_llm.requests) == 1
    assert (root / "HISTORY.md").read_text().count(ENTRY) == 1


def history_disk_full(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Writes to HISTORY.md fail with ENOSPC while the returned flag's ``[0]`` is True, refused at the
    system call (``os.write``), so our code runs as it would on a full disk."""
    full = [True]
    real = os.write

    def write(fd: int, data: Any) -> int:
        if full[0] and "/memory/HISTORY" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    return full


async def made_once_and_not_again(
    memory: MemoryService, tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer
) -> None:
    """After the consolidation the disk refused and the chat's next one: both written once (HISTORY
    entries, MEMORY.md, the fact), no record left, and a restart asks the model for nothing more."""
    root = memory.root
    await memory.close()  # (waits for every consolidation)
    assert len(fake_llm.requests) == 2
    history = (root / "HISTORY.md").read_text()
    assert history.count(ENTRY) == 1 and history.count("Porto was planned.") == 1
    assert f"- {FACT}" in (root / "MEMORY.md").read_text()
    assert list((root / "pending").iterdir()) == []  # nothing left for the next start
    restarted = await running_bot(tmp_path, clock, llm)
    assert [i.content for i in restarted.items.items(Layer.EPISODIC) if i.content == FACT] == [FACT]
    await restarted.close()
    assert len(fake_llm.requests) == 2


async def test_a_consolidation_the_full_disk_refused_is_made_once_space_is_back_without_a_restart(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background consolidation whose HISTORY entry the disk refused crashed and left its record to
    the next start: until a restart (weeks, for a bot that runs on) the retired messages had no HISTORY
    entry, no MEMORY.md change and no facts. The next retirement the disk takes makes it, from the plan
    the model gave (not asked again)."""
    full = history_disk_full(monkeypatch)
    memory = await running_bot(tmp_path, clock, llm)
    fake_llm.script(FakeReply(text=ANSWER))
    first = await memory.consolidate_in_background("cli:me", talk(clock))
    assert first is not None
    with pytest.raises(OSError, match="No space"):
        await first
    full[0] = False  # space is back
    clock.advance(minutes=5)
    later = [Message(Role.USER, "Porto next, part 9", timestamp=clock.now)]
    fake_llm.script(FakeReply(text=json.dumps({"history_entry": "Porto was planned.", "memory_update": ""})))
    second = await memory.consolidate_in_background("cli:me", later)  # the chat's next trim
    assert second is not None
    await second
    await made_once_and_not_again(memory, tmp_path, clock, llm, fake_llm)


async def test_an_awaited_consolidation_the_full_disk_refused_is_made_once_space_is_back_without_a_restart(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compaction and /new await the consolidation: one whose HISTORY entry the disk refused raised and
    left its record to the next start (only a background one was made again by the running bot), so
    until a restart its messages, archived already, had no HISTORY entry, MEMORY.md change or facts."""
    full = history_disk_full(monkeypatch)
    memory = await running_bot(tmp_path, clock, llm)
    fake_llm.script(FakeReply(text=ANSWER))
    with pytest.raises(OSError, match="No space"):
        await memory.consolidate("cli:me", talk(clock))  # compaction's retirement
    full[0] = False  # space is back
    clock.advance(minutes=5)
    later = [Message(Role.USER, "Porto next, part 9", timestamp=clock.now)]
    fake_llm.script(FakeReply(text=json.dumps({"history_entry": "Porto was planned.", "memory_update": ""})))
    await memory.consolidate("cli:me", later)  # the chat's next compaction
    await made_once_and_not_again(memory, tmp_path, clock, llm, fake_llm)


class TightArchiveDisk:
    """Writes under ``memory/archive/`` larger than ``room`` bytes fail with ENOSPC (``room``: None, any
    write fits), as a nearly full disk refuses a big append and takes a small one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, room: int | None) -> None:
        self.room = room
        real = os.write

        def write(fd: int, data: Any) -> int:
            tight = self.room is not None and len(data) > self.room
            if tight and "/memory/archive/" in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data)

        monkeypatch.setattr(os, "write", write)


def answer_naming(topics: list[str]) -> Any:
    """A model that gives each consolidation the HISTORY entry "<topic> was planned." for the topic
    its messages name."""

    def reply(_api: str, body: dict[str, Any]) -> FakeReply | None:
        said = json.dumps(body)
        topic = next((t for t in topics if t in said), None)
        if topic is None:
            return None
        return FakeReply(text=json.dumps({"history_entry": f"{topic} was planned.", "memory_update": ""}))

    return reply


def entries(root: Path) -> list[str]:
    return [line for line in (root / "HISTORY.md").read_text().splitlines() if line.endswith(" was planned.")]


def said(clock: Clock, topic: str, size: int = 1) -> list[Message]:
    return [
        Message(Role.USER, f"{topic} trip. " * size, timestamp=clock.now),
        Message(Role.ASSISTANT, "Noted."),
    ]


async def test_retirements_a_start_could_not_archive_are_made_when_space_is_back_and_in_each_chats_order(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill left chat cli:other's retirement unarchived and cli:me's archived but not consolidated; the
    start's disk refused the first archive. cli:me's record, which needs no write, waited behind
    another chat's until the next start, while cli:me's newer retirements were made at once (an older
    HISTORY entry, and MEMORY.md change, after a newer one); cli:other's waited for a restart even
    once the disk had space again."""
    root = tmp_path / "memory"
    pending = PendingConsolidations(root / "pending")
    await pending.add("cli:other", said(clock, "Madrid"), clock.now)  # killed before its archive
    clock.advance(seconds=1)
    lisbon = said(clock, "Lisbon")
    await pending.add("cli:me", lisbon, clock.now)
    await TranscriptArchive(root / "archive").append("cli:me", lisbon, clock.now)  # killed after it
    fake_llm.responder = answer_naming(["Madrid", "Lisbon", "Porto"])
    disk = TightArchiveDisk(monkeypatch, room=0)  # the start's disk is full
    memory = await running_bot(tmp_path, clock, llm)

    disk.room = None  # space is back
    clock.advance(minutes=5)
    task = await memory.consolidate_in_background("cli:me", said(clock, "Porto"))  # cli:me's next trim
    assert task is not None
    await task
    await memory.close()
    history = entries(root)
    assert sorted(history) == ["Lisbon was planned.", "Madrid was planned.", "Porto was planned."]
    assert history.index("Lisbon was planned.") < history.index("Porto was planned.")
    assert list((root / "pending").iterdir()) == []  # nothing left for the next start
    restarted = await running_bot(tmp_path, clock, llm)
    await restarted.close()
    assert len(fake_llm.requests) == 3


async def test_a_chats_new_retirement_waits_behind_its_retirement_the_disk_will_not_archive_yet(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk refuses the big archive append of a retirement a kill left, and takes the chat's newer,
    small one: that was archived and consolidated first, its HISTORY entry (and MEMORY.md change)
    before the older one's. Now it waits, its messages kept in the session, and follows it."""
    root = tmp_path / "memory"
    await PendingConsolidations(root / "pending").add("cli:me", said(clock, "Lisbon", 500), clock.now)
    fake_llm.responder = answer_naming(["Lisbon", "Porto"])
    disk = TightArchiveDisk(monkeypatch, room=2000)  # room for a small append, not for a big one
    memory = await running_bot(tmp_path, clock, llm)
    clock.advance(minutes=5)
    porto = said(clock, "Porto")
    with pytest.raises(StorageError, match="waits for the disk"):
        await memory.consolidate_in_background("cli:me", porto)  # the chat's next trim
    assert await memory.archive.read("cli:me") == [] and len(fake_llm.requests) == 0

    disk.room = None  # space is back
    task = await memory.consolidate_in_background("cli:me", porto)  # the trim after (the messages stayed)
    assert task is not None
    await task
    await memory.close()
    assert entries(root) == ["Lisbon was planned.", "Porto was planned."]
    assert list((root / "pending").iterdir()) == []


async def test_a_consolidation_the_full_disk_refused_is_made_before_the_chats_next_awaited_one(
    tmp_path: Path, clock: Clock, llm: LLMClient, fake_llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Made again once the disk took the chat's next retirement, it was made after that one when the
    next was awaited (a compaction, /new): its HISTORY entry came after the newer one's."""
    full = history_disk_full(monkeypatch)
    memory = await running_bot(tmp_path, clock, llm)
    fake_llm.responder = answer_naming(["Lisbon", "Porto"])
    with pytest.raises(OSError, match="No space"):
        await memory.consolidate("cli:me", said(clock, "Lisbon"))  # compaction's retirement
    full[0] = False  # space is back
    clock.advance(minutes=5)
    await memory.consolidate("cli:me", said(clock, "Porto"))  # the chat's next compaction
    await memory.close()
    assert entries(tmp_path / "memory") == ["Lisbon was planned.", "Porto was planned."]
