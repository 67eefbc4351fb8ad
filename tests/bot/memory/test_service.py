"""MemoryService: permissions, the write path (notes + items), and the prompt's order and omissions."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from bot.config import MemorySettings
from bot.domain import Message, Role
from bot.memory import Exchange, Layer, MemoryService
from bot.memory.pack import estimate_tokens
from bot.memory.prompt import READING_NOTE
from bot.memory.recent import informative
from tests.bot.memory.conftest import Clock, make_memory

TOKYO = ZoneInfo("Asia/Tokyo")  # loaded at import, off the event loop (as settings validation does)


def exchange(clock: Clock, user: str, answer: str, sid: str = "cli:me") -> Exchange:
    return Exchange(
        sid,
        Message(Role.USER, user, timestamp=clock.now),
        Message(Role.ASSISTANT, answer, timestamp=clock.now),
    )


async def test_start_fixes_permissions(tmp_path: Path, clock: Clock) -> None:
    root = tmp_path / "memory"
    (root / "items").mkdir(parents=True)
    (root / "MEMORY.md").write_text("- x\n")
    os.chmod(root, 0o755)
    os.chmod(root / "MEMORY.md", 0o644)
    memory = await make_memory(tmp_path, clock)
    assert root.stat().st_mode & 0o777 == 0o700
    assert (root / "MEMORY.md").stat().st_mode & 0o777 == 0o600
    await memory.record_exchanges([exchange(clock, "hi", "hello")])
    for path in root.rglob("*"):
        assert path.stat().st_mode & 0o777 == (0o700 if path.is_dir() else 0o600), path


async def test_start_gives_back_no_write_permission_taken_away(tmp_path: Path, clock: Clock) -> None:
    """``chmod a-w MEMORY.md`` (the operator froze it): the start made it 0600 again, writable."""
    root = tmp_path / "memory"
    root.mkdir()
    (root / "MEMORY.md").write_text("- x\n")
    os.chmod(root / "MEMORY.md", 0o444)
    memory = await make_memory(tmp_path, clock)
    assert (root / "MEMORY.md").stat().st_mode & 0o777 == 0o400  # (read by others no longer)
    await memory.close()


async def test_daily_note_line_is_folded_and_capped(memory: MemoryService, clock: Clock) -> None:
    await memory.record_exchanges(
        [exchange(clock, "line one\nline two " + "u" * 300, "ok\n\nsure " + "a" * 400)]
    )
    text = (memory.root / "2024-05-20.md").read_text()
    line = text.rstrip("\n")
    assert "\n" not in line and line.startswith("[09:30] User: line one line two u")
    user, assistant = line.split(" | Assistant: ")
    assert len(user.removeprefix("[09:30] User: ")) == 200 and len(assistant) == 300


async def test_notes_follow_the_configured_time_zone(tmp_path: Path, clock: Clock) -> None:
    memory = await make_memory(tmp_path, clock, timezone="Asia/Tokyo")
    await memory.record_exchanges([exchange(clock, "hi", "hello")])
    assert (memory.root / "2024-05-20.md").read_text().startswith("[18:30] User: hi")


async def test_turn_items_keep_references(memory: MemoryService, clock: Clock) -> None:
    ex = exchange(clock, "Remember that my passport number ends in 42.", "Noted.")
    stored = await memory.record_exchanges([ex])
    assert ex.user is not None
    assert all(i.references[0].session_id == "cli:me" for i in stored)
    assert {i.references[0].message_id for i in stored} == {ex.user.id, ex.assistant.id}  # type: ignore[union-attr]
    semantic = memory.items.items(Layer.SEMANTIC)  # a 0.9-confidence fact is promoted at once
    assert [i.content for i in semantic] == ["Remember that my passport number ends in 42."]
    assert semantic[0].references == (ex.user and stored[0].references[0],)


async def test_prompt_order_and_omission_rules(memory: MemoryService, clock: Clock) -> None:
    empty = await memory.context("anything")
    assert (
        empty.text == "Current date and time: 2024-05-20 09:30 (Monday), UTC."
    )  # nothing remembered: the date alone

    await memory.longterm.update(lambda _: "- Operator: user is called Sam\n")
    only_long_term = await memory.context("")
    assert (
        only_long_term.text == "# Memory\n\nCurrent date and time: 2024-05-20 09:30 (Monday), UTC.\n\n"
        f"{READING_NOTE}\n\n## Long-term Memory\n- Operator: user is called Sam"
    )

    clock.advance(days=-2)
    await memory.record_exchanges([exchange(clock, "we fixed the boiler", "great")])
    clock.advance(days=2)
    await memory.record_exchanges([exchange(clock, "what about lunch at the ramen place", "soup at Ichiran")])

    no_pack = await memory.context("zebra")  # nothing relevant: the legacy recent context is shown
    assert no_pack.pack.text == ""
    order = [
        no_pack.text.index(h)
        for h in ("## Long-term Memory", "## Today's Notes", "## Recent Context", "### 2024-05-18")
    ]
    assert order == sorted(order)
    assert "## Relevant Memory" not in no_pack.text

    with_pack = await memory.context("boiler")
    text = with_pack.text
    assert (
        text.index("## Long-term Memory") < text.index("## Relevant Memory") < text.index("## Today's Notes")
    )
    assert "we fixed the boiler" in text and "## Recent Context" not in text
    assert with_pack.diagnostics["pack"]


async def test_last_recall_is_kept_per_chat(memory: MemoryService, clock: Clock) -> None:
    await memory.record_exchanges([exchange(clock, "we fixed the boiler", "great")])
    assert memory.last_recall("tg:1") is None
    await memory.context("boiler", session_id="tg:1")
    await memory.context("zebra", session_id="tg:2")  # a later turn of another chat
    one, two = memory.last_recall("tg:1"), memory.last_recall("tg:2")
    assert one is not None and two is not None
    assert one["pack"]["query"] == "boiler" and one["pack"]["chosen"]  # type: ignore[index]
    assert two["pack"]["query"] == "zebra" and not two["pack"]["chosen"]  # type: ignore[index]
    assert isinstance(one["pack"]["ms"], float)  # type: ignore[index]


async def test_long_term_memory_is_capped_with_a_visible_notice(tmp_path: Path, clock: Clock) -> None:
    memory = await make_memory(tmp_path, clock, inject_max_bytes=100)
    big = "".join(f"- fact number {i}\n" for i in range(50))
    await memory.longterm.update(lambda _: big)
    text = (await memory.context("")).text
    assert "MEMORY.md truncated" in text and "- fact number 0" in text and "- fact number 49" not in text
    assert (memory.root / "MEMORY.md").read_text() == big  # the file itself is never cut


async def test_operator_edit_is_seen_by_the_very_next_context(memory: MemoryService) -> None:
    assert "likes cats" not in (await memory.context("x")).text
    (memory.root / "MEMORY.md").write_text("- likes cats\n")
    assert "- likes cats" in (await memory.context("x")).text


async def test_recent_context_shows_only_the_configured_days(tmp_path: Path, clock: Clock) -> None:
    memory = await make_memory(tmp_path, clock, recent_days=2)
    for back in (3, 2, 1):
        clock.advance(days=-back)
        await memory.record_exchanges([exchange(clock, f"day minus {back}", "ok")])
        clock.advance(days=back)
    text = (await memory.context("")).text
    assert "### 2024-05-19" in text and "### 2024-05-18" in text and "### 2024-05-17" not in text
    assert text.index("### 2024-05-18") < text.index("### 2024-05-19")  # in the order it was said


def test_acknowledgements_are_not_informative() -> None:
    for ack in (
        "thanks!",
        "Thanks a lot!",
        "ok, great",
        "Okay, sounds good!",
        "Cool, thank you so much!",
        "",
    ):
        assert not informative(ack), ack
    for said in ("we fixed the boiler", "great, the boiler works now", "Thanks, my flight is at 9"):
        assert informative(said), said
    # Decided by the message's start, except when that start says nothing.
    assert informative("thanks " * 60 + "my flight is at 9")
    assert not informative("thanks " * 60 + "ok")


async def test_todays_notes_leave_out_acknowledgements(memory: MemoryService, clock: Clock) -> None:
    await memory.record_exchanges([exchange(clock, "we fixed the boiler", "Glad the boiler works again")])
    clock.advance(minutes=5)
    await memory.record_exchanges([exchange(clock, "Thanks a lot!", "Okay, great!")])
    clock.advance(minutes=5)
    text = (await memory.context("zebra")).text  # nothing relevant: no pack, the notes show today
    assert "## Relevant Memory" not in text
    notes = text.split("## Today's Notes", 1)[1]
    assert "we fixed the boiler" in notes and "Glad the boiler works again" in notes
    assert "Thanks a lot" not in notes and "Okay, great" not in notes


async def test_a_message_dated_in_the_future_is_noted_under_today(
    memory: MemoryService, clock: Clock
) -> None:
    future = Exchange(
        "cli:me",
        Message(Role.USER, "hello from a wrong clock", timestamp=clock.now + timedelta(days=30000)),
        Message(Role.ASSISTANT, "hi", timestamp=clock.now),
    )
    await memory.record_exchanges([future])
    assert sorted(p.name for p in memory.root.glob("*.md")) == ["2024-05-20.md"]


async def test_a_question_that_names_only_a_time_is_shown_what_was_said_then(
    memory: MemoryService, clock: Clock
) -> None:
    """ "What did we talk about last Thursday?" has no word to match: the notes of that day stand in
    for the pack, instead of the last week's (2024-05-20 is a Monday)."""
    clock.advance(days=-11)  # Thursday 2024-05-09
    await memory.record_exchanges([exchange(clock, "we planned the garden layout", "Raised beds, then")])
    clock.advance(days=9)  # Saturday 2024-05-18
    await memory.record_exchanges([exchange(clock, "my tax return is due soon", "Start this week")])
    clock.advance(days=2)

    named = (await memory.context("What did we talk about on Thursday the week before last?")).text
    thursday = (await memory.context("What did we talk about 11 days ago?")).text
    lately = (await memory.context("What did we talk about?")).text

    assert "### 2024-05-09" in thursday and "garden layout" in thursday and "tax return" not in thursday
    assert "tax return" in lately and "garden" not in lately  # no period named: the last 7 days
    assert "garden" not in named  # "on Thursday" is the last one (05-16): nothing was said then


async def test_the_running_bot_starts_by_rewriting_a_log_a_kill_left_a_torn_record_in(
    tmp_path: Path, clock: Clock
) -> None:
    """The fragment is kept aside and its message recorded again (recover); the log is rewritten at
    start, not at the first maintenance, which a start with nothing to answer would never reach."""
    first = MemoryService(tmp_path, MemorySettings(), clock=clock, maintain_every=timedelta(days=1))
    await first.start()
    await first.record_exchanges([exchange(clock, "my bike is a red Gazelle", "nice bike")])
    await first.close()
    (log,) = (tmp_path / "items" / "episodic").glob("*.jsonl")
    with log.open("ab") as f:
        f.write(b'{"id": "cut short by a kill", "layer": "epi')
    operator = MemoryService(tmp_path, MemorySettings(), clock=clock)  # `membot memory ...`: reads only
    await operator.start()
    assert log.read_bytes().endswith(b'"layer": "epi')
    await operator.close()
    bot = MemoryService(tmp_path, MemorySettings(), clock=clock, maintain_every=timedelta(days=1))
    await bot.start()
    assert all(line.startswith(b"{") and line.endswith(b"}") for line in log.read_bytes().splitlines()), (
        log.read_bytes()[-300:]
    )
    assert any("Gazelle" in i.content for i in bot.items.items())
    await bot.close()


async def test_the_running_bot_maintains_items_when_due_also_at_a_consolidation(
    tmp_path: Path, clock: Clock
) -> None:
    def running_bot(every: timedelta) -> MemoryService:
        root = tmp_path / f"every-{every.days}-days"
        return MemoryService(root, MemorySettings(), clock=clock, maintain_every=every)

    def salience(service: MemoryService, content: str) -> float:
        (found,) = [i for i in service.items.items(Layer.EPISODIC) if content in i.content]
        return found.salience

    daily, yearly = running_bot(timedelta(days=1)), running_bot(timedelta(days=365))
    for service in (daily, yearly):
        await service.start()
        await service.record_exchanges([exchange(clock, "chit chat about clouds", "indeed")])
        await service.settled()  # the first maintenance after a start
    start = salience(daily, "clouds")
    clock.advance(days=40)
    await daily.record_exchanges([exchange(clock, "and now the rain", "yes")])
    # Due, and started in the background: the answer's writes (which its reply waits for) are done first.
    assert salience(daily, "clouds") == start
    await daily.settled()
    assert salience(daily, "clouds") == start / 2  # a day had passed: decayed while answering
    await yearly.record_exchanges([exchange(clock, "and now the rain", "yes")])
    await yearly.settled()
    assert salience(yearly, "clouds") == start  # not due yet...
    await yearly.consolidate("cli:me", [Message(Role.USER, "retired", timestamp=clock.now)])
    await yearly.settled()
    assert salience(yearly, "clouds") == start  # ...nor at a consolidation (a full pass over every item)
    clock.advance(days=365)
    await yearly.consolidate("cli:me", [Message(Role.USER, "retired later", timestamp=clock.now)])
    await yearly.settled()
    assert salience(yearly, "clouds") == start / 2  # due: a consolidation maintains too
    assert salience(yearly, "rain") == start / 2
    await daily.close()
    await yearly.close()


async def test_what_was_recalled_survives_a_restart(tmp_path: Path, clock: Clock) -> None:
    def running_bot() -> MemoryService:
        return MemoryService(tmp_path, MemorySettings(), clock=clock, maintain_every=timedelta(days=1))

    bot = running_bot()
    await bot.start()
    await bot.record_exchanges([exchange(clock, "my bike is a red Gazelle", "nice bike")])
    clock.advance(days=20)
    await bot.pack("what colour is my bike")  # recalled: decay must count from now, not from the turn
    await bot.close()

    restarted = running_bot()
    await restarted.start()
    (bike,) = [i for i in restarted.items.items(Layer.EPISODIC) if "Gazelle" in i.content]
    assert bike.last_accessed_at == clock.now
    await restarted.close()


async def test_maintain_promotes_and_decays(memory: MemoryService, clock: Clock) -> None:
    await memory.record_exchanges([exchange(clock, "chit chat about clouds", "indeed")])
    clock.advance(days=40)
    report = await memory.maintain()
    assert report["decayed"] >= 1
    assert all(i.salience < 0.5 for i in memory.items.items(Layer.EPISODIC))
    clock.now += timedelta(seconds=1)


async def test_archive_keeps_every_message_around_damaged_lines(memory: MemoryService, clock: Clock) -> None:
    first = [Message(Role.USER, f"before {n}", timestamp=clock.now) for n in range(2)]
    await memory.archive_messages("cli:me", first)
    with memory.archive.path_for("cli:me").open("ab") as f:
        f.write(b'{"message": "\xff\xfe"}\n{"archived_at": "torn')  # bad UTF-8, then a crash
    later = [Message(Role.USER, f"after {n}", timestamp=clock.now) for n in range(2)]
    await memory.archive_messages("cli:me", later)
    archived = await memory.archive.read("cli:me")
    assert [m.content for m in archived] == ["before 0", "before 1", "after 0", "after 1"]
    # The record a kill cut short is kept aside and cut: it does not stay in the middle of the file.
    path = memory.archive.path_for("cli:me")
    lines = path.read_bytes().splitlines()
    assert b'{"archived_at": "torn' not in lines and len(lines) == 5  # the bad UTF-8 line stays
    (aside,) = path.parent.glob(path.name + ".damaged-*")
    assert aside.read_bytes() == b'{"archived_at": "torn\n'


async def test_a_turn_counts_no_text_the_turn_before_counted(tmp_path: Path, clock: Clock) -> None:
    """The section's fixed texts (headings, the date line, MEMORY.md) are counted once, not every turn:
    a tokenizer call lets go of the GIL, and a busy loop can wait milliseconds to get it back."""
    counted: list[str] = []

    def count(text: str) -> int:
        counted.append(text)
        return len(text) // 4 + 1

    memory = MemoryService(
        tmp_path / "memory", MemorySettings(), timezone="UTC", clock=clock, count_tokens=count
    )
    await memory.start()
    try:
        await memory.longterm.update(lambda _: "- Operator: user is called Sam\n")
        await memory.record_exchanges([exchange(clock, "I bake sourdough every Sunday morning.", "Lovely.")])
        await memory.context("when do I bake sourdough?", session_id="cli:me")
        first = set(counted)
        assert {"# Memory", "## Relevant Memory"} <= first
        counted.clear()
        await memory.context("when do I bake sourdough?", session_id="cli:me")
        assert not set(counted) & first
    finally:
        await memory.close()


async def test_the_sections_count_covers_its_whole_text(memory: MemoryService, clock: Clock) -> None:
    """The context budget plans with ``tokens``: every part of the section must be in it, the note on how
    to read memory too, or a small window would overflow by what was left out."""
    await memory.longterm.update(lambda _: "- Operator: user is called Sam\n")
    clock.advance(days=-1)
    await memory.record_exchanges([exchange(clock, "we fixed the boiler on Tuesday", "great news")])
    clock.advance(days=1)
    built = await memory.context("the boiler", budget=3000)
    assert READING_NOTE in built.text and "## Relevant Memory" in built.text
    assert estimate_tokens(built.text) <= built.tokens


async def test_memory_turned_off_and_on_again_finds_what_was_said_meanwhile(
    tmp_path: Path, clock: Clock
) -> None:
    # With memory off the bot builds no read path (bot/memory/reading.py): nothing keeps the word index
    # current, and the next start with memory on must index what was written meanwhile.
    def running_bot(*, retrieval: bool) -> MemoryService:
        return MemoryService(
            tmp_path, MemorySettings(), clock=clock, maintain_every=timedelta(days=1), retrieval=retrieval
        )

    on = running_bot(retrieval=True)
    await on.start()
    await on.record_exchanges([exchange(clock, "my bike is a red Gazelle", "nice bike")])
    await on.close()

    off = running_bot(retrieval=False)
    await off.start()
    clock.advance(days=2)
    await off.record_exchanges([exchange(clock, "my car is a blue Volvo", "nice car")])  # and maintains
    with pytest.raises(RuntimeError, match="without retrieval"):
        await off.search("car")
    await off.close()

    again = running_bot(retrieval=True)
    await again.start()
    assert any("Volvo" in hit.item.content for hit in await again.search("which car do I drive"))
    assert any("Gazelle" in hit.item.content for hit in await again.search("what colour is my bike"))
    await again.close()
