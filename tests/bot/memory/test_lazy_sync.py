"""A turn's memory writes are fsynced a moment later; a power cut before that loses nothing for good.

The power cut is simulated on a copy of a running bot's workspace: the session logs are as they were
(fsynced before each reply), and the memory lines not yet fsynced are cut away, as a cut may leave them.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from bot.domain import Session
from bot.memory.lazy_sync import MARKER, LazySync
from tests.bot.membot_service import Service, membot_run
from tests.bot.memory.test_end_to_end import DAY, Chat, chat
from tests.fakes.llm_server import FakeLLMServer


async def test_the_marker_lives_from_the_first_unsynced_write_to_a_clean_close(tmp_path: Path) -> None:
    flushes: list[int] = []

    async def flush() -> None:
        flushes.append(len(flushes))

    marker = tmp_path / MARKER
    lazy = LazySync(marker, flush, delay=0.01)
    assert not marker.exists() and not lazy.pending
    async with lazy.writing():
        assert marker.exists()  # in place before the write it covers
    assert lazy.pending
    for _ in range(100):
        if not lazy.pending:
            break
        await asyncio.sleep(0.01)
    assert flushes == [0] and not lazy.pending
    synced_at = datetime.fromisoformat(await asyncio.to_thread(marker.read_text))  # moved up, still there
    assert synced_at <= datetime.now(UTC)
    await lazy.close()
    assert not marker.exists()  # a clean stop leaves nothing to look for


async def test_a_clock_stepped_back_moves_the_marker_back_before_the_next_write(tmp_path: Path) -> None:
    """The sessions a turn saves are dated by the same clock: with the marker left at the later time, a
    start after a power cut would not look back far enough to record their messages again."""

    async def flush() -> None:
        pass

    now = [datetime(2024, 3, 4, 9, 0, tzinfo=UTC)]
    marker = tmp_path / MARKER
    lazy = LazySync(marker, flush, delay=3600, clock=lambda: now[0])
    async with lazy.writing():
        pass
    now[0] -= timedelta(minutes=10)  # NTP steps the clock back
    async with lazy.writing():
        assert await asyncio.to_thread(marker.read_text) == "2024-03-04T08:50:00+00:00"
    await lazy.close()


async def test_a_marker_left_by_a_stopped_run_goes_only_once_recovered(tmp_path: Path) -> None:
    async def flush() -> None:
        pass

    marker = tmp_path / MARKER
    await asyncio.to_thread(marker.write_text, "2024-03-04T09:00:00+00:00")
    lazy = LazySync(marker, flush)
    assert await asyncio.to_thread(lazy.left_by_last_run) == datetime(2024, 3, 4, 9, tzinfo=UTC)
    async with lazy.writing():
        pass
    await lazy.close()  # an operator command that opened memory: the marker is not its to drop
    assert await asyncio.to_thread(marker.read_text) == "2024-03-04T09:00:00+00:00"
    await lazy.recovered()
    assert not await asyncio.to_thread(marker.exists)
    await asyncio.to_thread(marker.write_text, "2024-03-0")  # torn by the cut itself: look at everything
    torn = LazySync(marker, flush)
    assert await asyncio.to_thread(torn.left_by_last_run) == datetime.fromtimestamp(0, UTC)
    await asyncio.to_thread(marker.write_bytes, b"2024-03-04\xff\xfe")  # not even UTF-8: the same
    damaged = LazySync(marker, flush)
    assert await asyncio.to_thread(damaged.left_by_last_run) == datetime.fromtimestamp(0, UTC)


def _cut_memory_of(ws: Path, message_ids: set[str], texts: list[str]) -> int:
    """Remove the items made from ``message_ids`` and the note lines holding ``texts``: lost in the cut."""
    cut = 0
    for log in (ws / "memory" / "items").rglob("*.jsonl"):
        kept = []
        for line in log.read_text().splitlines():
            refs = json.loads(line).get("references", [])
            if any(r.get("message_id") in message_ids for r in refs):
                cut += 1
            else:
                kept.append(line)
        log.write_text("".join(f"{line}\n" for line in kept))
    for notes in (ws / "memory").glob("????-??-??.md"):
        lines = notes.read_text().splitlines()
        notes.write_text("".join(f"{x}\n" for x in lines if not any(t in x for t in texts)))
    return cut


SAID = ["I planted three apple trees in the orchard.", "The plumber fixes the boiler on Friday."]


async def told_three_things(bot: Chat) -> Session:
    """Hanna's city, then :data:`SAID`, a minute apart; the chat's session after them."""
    await bot.say("My sister Hanna lives in Porto.", DAY)
    for i, text in enumerate(SAID):
        await bot.say(text, DAY + timedelta(minutes=1 + i))
    session = await bot.core.sessions.get("test:c1")
    assert session is not None
    return session


async def test_a_power_cut_before_the_sync_loses_no_memory(tmp_path: Path) -> None:
    said = SAID
    async with chat(tmp_path / "running") as bot:
        session = await told_three_things(bot)
        lost = {m.id for m in session.messages[-4:]}  # the last two exchanges, question and answer
        ws = tmp_path / "running" / "ws"
        assert (ws / "memory" / MARKER).exists()  # the bot runs: writes may be unsynced
        await asyncio.to_thread(shutil.copytree, ws, tmp_path / "cut" / "ws")  # the disk as the cut left it
    assert not (ws / "memory" / MARKER).exists()  # closed cleanly
    assert await asyncio.to_thread(_cut_memory_of, tmp_path / "cut" / "ws", lost, said) > 0

    with capture_logs() as logs:
        async with chat(tmp_path / "cut") as bot:  # the next start
            memory = bot.core.memory
            assert all(memory.items.index.of_message(("test:c1", mid)) for mid in lost)
            notes = await asyncio.to_thread((memory.root / f"{DAY:%Y-%m-%d}.md").read_text)
            assert all(notes.count(f"User: {text}") == 1 for text in said)  # back, once
            assert notes.count("User: My sister Hanna lives in Porto.") == 1  # never lost: not twice
            assert not await asyncio.to_thread(
                (memory.root / MARKER).exists
            )  # recovered: nothing left to look for
            await bot.say("/new", DAY + timedelta(hours=1))
            await bot.say("When does the plumber come?", DAY + timedelta(days=1))
            assert "The plumber fixes the boiler on Friday." in bot.system_prompt()
    recovered = [e for e in logs if e["event"] == "memory_recovered"]
    assert len(recovered) == 1 and recovered[0]["messages"] == 4 and recovered[0]["sessions"] == 1


async def test_a_start_whose_recovery_the_disk_refuses_still_serves_and_the_next_one_recovers(
    tmp_path: Path,
) -> None:
    """The recovery's writes refused (every append to an item log fails, EFBIG, as on a full disk):
    ``membot run`` ended with a bare ``error: File too large`` (exit 1), and the systemd unit restarted
    it into the same failure until it gave up, every acknowledged message left unanswered. Now the start
    goes on with the failure logged; the marker stays, and the next start that can write recovers."""
    said = SAID
    async with chat(tmp_path / "running") as bot:
        session = await told_three_things(bot)
        lost = {m.id for m in session.messages[-4:]}
        await asyncio.to_thread(shutil.copytree, tmp_path / "running" / "ws", tmp_path / "cut" / "ws")
    ws = tmp_path / "cut" / "ws"
    assert await asyncio.to_thread(_cut_memory_of, ws, lost, said) > 0
    logs = list((ws / "memory" / "items").rglob("*.jsonl"))
    full = max(log.stat().st_size for log in logs)  # no item log grows past this: a full disk, for them
    async with FakeLLMServer() as llm:
        async with membot_run(ws, llm, max_file_bytes=full, MEMBOT_MEMORY__EMBEDDINGS="none") as service:
            await service.say("hi")  # answered: the start went on
            await service.wait_log("turn_finished")
            code, out = await _stopped(service)
        assert code == 0 and "hi" in out, service.stderr
        failed = [e for e in _events(service.stderr) if e["event"] == "memory_recovery_failed"]
        assert len(failed) == 1 and "free disk space" in failed[0]["hint"], service.stderr
        assert (ws / "memory" / MARKER).exists()  # left for the next start

        async with membot_run(ws, llm, MEMBOT_MEMORY__EMBEDDINGS="none") as service:
            code, _ = await _stopped(service)
        assert code == 0, service.stderr
    done = [e for e in _events(service.stderr) if e["event"] == "memory_recovered"]
    assert len(done) == 1 and done[0]["messages"] == 4, service.stderr
    assert not (ws / "memory" / MARKER).exists()
    items = "".join(log.read_text() for log in (ws / "memory" / "items").rglob("*.jsonl"))
    assert all(items.count(f'"content": "{text}"') == 1 for text in said), items  # back, once
    notes = (ws / "memory" / f"{DAY:%Y-%m-%d}.md").read_text()
    assert all(notes.count(f"User: {text}") == 1 for text in said), notes


async def _stopped(service: Service) -> tuple[int, str]:
    assert service.process.stdin is not None
    service.process.stdin.close()  # the terminal's input ends: it leaves, and the bot serves on
    service.process.send_signal(signal.SIGTERM)
    return await service.finish()


def _events(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
