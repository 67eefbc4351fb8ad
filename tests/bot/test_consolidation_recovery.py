"""Retired messages are consolidated once whatever happens to the process, proven on ``membot run``.

A trim archives the oldest messages and consolidates them in the background, after the session was
saved without them: a kill during that consolidation must not lose their HISTORY entry and facts, and a
start that resumes it must not write them twice.
"""

from __future__ import annotations

import asyncio
import json
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot.domain import Message, Role
from bot.memory.archive import TranscriptArchive
from bot.memory.pending import PENDING_DIR, PendingConsolidations
from tests.bot.membot_service import membot_run, stored, telegram_env
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.telegram_server import FakeTelegramServer

ENTRY = "We planned the Lisbon trip in May."
FACT = "- User flies to Lisbon on May 3rd"
SUMMARY = json.dumps(
    {
        "history_entry": ENTRY,
        "memory_update": FACT + "\n",
        "items": [{"type": "fact", "content": "User flies to Lisbon on May 3rd", "confidence": 0.9}],
    }
)
TRIM = {"MEMBOT_MEMORY__MEMORY_WINDOW": "4", "MEMBOT_MEMORY__KEEP_RECENT": "2"}


def consolidating(body: dict[str, Any]) -> bool:
    return "memory consolidation step" in json.dumps(body)


def consolidations(llm: FakeLLMServer) -> int:
    return sum(consolidating(r.body) for r in llm.requests)


async def stop(service: object) -> None:
    process = service.process  # type: ignore[attr-defined]
    process.send_signal(signal.SIGTERM)
    code, _ = await service.finish()  # type: ignore[attr-defined]
    assert code == 0, service.stderr  # type: ignore[attr-defined]


async def wait_until(check: Any, timeout: float = 20) -> None:
    async with asyncio.timeout(timeout):
        while not await asyncio.to_thread(check):
            await asyncio.sleep(0.05)


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def test_a_consolidation_killed_midway_is_made_once_by_the_next_start(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    memory = workspace / "memory"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        env = telegram_env(tg, **TRIM)
        llm.responder = lambda _api, body: FakeReply(text="never", delay=60) if consolidating(body) else None
        async with membot_run(workspace, llm, **env) as service:
            for n in range(3):
                tg.push_message(f"Lisbon trip, part {n}", chat_id=777, user_id=42)
                await tg.wait_for_messages(n + 1, chat_id=777, timeout=30)
            # The third answer went out after its session was saved without the oldest four messages.
            await tg.wait_for(lambda: consolidations(llm) == 1, timeout=30)
            await service.kill()
        assert len(await asyncio.to_thread(stored, workspace, "telegram:777")) == 2
        assert ENTRY not in await asyncio.to_thread(read, memory / "HISTORY.md")

        llm.responder = lambda _api, body: FakeReply(text=SUMMARY) if consolidating(body) else None
        async with membot_run(workspace, llm, **env) as service:
            await wait_until(lambda: ENTRY in read(memory / "HISTORY.md"))
            await stop(service)
        async with membot_run(workspace, llm, **env) as service:  # nothing left to resume
            await stop(service)
        assert consolidations(llm) == 2

    history = await asyncio.to_thread(read, memory / "HISTORY.md")
    assert history.count(ENTRY) == 1 and "[raw-fallback]" not in history
    assert (await asyncio.to_thread(read, memory / "MEMORY.md")).count(FACT) == 1
    prompt = [r for r in llm.requests if consolidating(r.body)][-1].body["messages"][-1]["content"]
    assert "Lisbon trip, part 0" in prompt and "Lisbon trip, part 2" not in prompt


async def test_a_retirement_the_disk_will_not_archive_at_the_start_waits_for_the_next_start(
    tmp_path: Path,
) -> None:
    """A kill between a retirement's record and its archive append leaves messages only the record
    holds; a start whose disk refuses that append (here every write past the archive's size, as a full
    disk refuses it) ended with a bare ``error: File too large`` (exit 1), which systemd restarted into
    the same failure. Now the start goes on and serves; the record stays, and the next start archives
    and consolidates it, once."""
    workspace = tmp_path / "ws"
    memory = workspace / "memory"
    sid = "telegram:777"
    garden = "We talked about the garden. " * 300  # (8 KB: the chat's other files stay below it)
    earlier = [Message(Role.USER, garden), Message(Role.ASSISTANT, "Yes.")]
    retiring = [Message(Role.USER, "Lisbon trip, part 0"), Message(Role.ASSISTANT, "Noted.")]
    archive = TranscriptArchive(memory / "archive")
    await archive.append(sid, earlier, datetime.now(UTC))
    await PendingConsolidations(memory / PENDING_DIR).add(sid, retiring, datetime.now(UTC))
    full = archive.path_for(sid).stat().st_size  # the chat's archive cannot grow: a full disk, for it
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        env = telegram_env(tg, MEMBOT_MEMORY__EMBEDDINGS="none", MEMBOT_TELEGRAM__POLL_TIMEOUT="1")
        llm.responder = lambda _api, body: FakeReply(text=SUMMARY) if consolidating(body) else None
        async with membot_run(workspace, llm, max_file_bytes=full, **env) as service:
            tg.push_message("still there?", chat_id=777, user_id=42)
            [answer] = await tg.wait_for_messages(1, chat_id=777, timeout=30)
            assert "still there?" in answer.text  # answered: the start went on
            await stop(service)
        assert '"event": "consolidations_not_resumed"' in service.stderr, service.stderr
        assert consolidations(llm) == 0 and len(list((memory / PENDING_DIR).iterdir())) == 1

        async with membot_run(workspace, llm, **env) as service:
            await wait_until(lambda: ENTRY in read(memory / "HISTORY.md"))
            await stop(service)
    assert consolidations(llm) == 1 and not list((memory / PENDING_DIR).iterdir())
    archived = await asyncio.to_thread(read, archive.path_for(sid))
    assert all(archived.count(json.dumps(m.content)) == 1 for m in earlier + retiring), archived
    assert (await asyncio.to_thread(read, memory / "HISTORY.md")).count(ENTRY) == 1
