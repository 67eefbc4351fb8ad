"""The usage ledger: daily totals split by purpose, kept across restarts, older files still read."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from structlog.testing import capture_logs

from bot.domain import Usage
from bot.errors import StorageError
from bot.usage import UsageLedger

NOON = datetime(2025, 3, 4, 12, tzinfo=UTC)


def ledger(path: Path) -> UsageLedger:
    return UsageLedger(path, tz=ZoneInfo("UTC"), clock=lambda: NOON, flush_interval=3600)


async def journaled(path: Path, *calls: tuple[str, Usage]) -> UsageLedger:
    """A ledger that recorded ``calls`` and has them in its journal (never flushed)."""
    book = ledger(path)
    for purpose, usage in calls:
        await book.record(purpose, "m", usage)
    await book.written()
    return book


async def test_calls_are_split_by_purpose_and_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"
    first = ledger(path)
    await first.record("chat", "gpt-4.1-mini", Usage(100, 10, cost_usd=0.01, calls=1))
    await first.record("compaction", "gpt-4.1-mini", Usage(50, 5, cost_usd=0.002, calls=1))
    await first.record("chat", "gpt-4.1-mini", Usage(120, 12, cost_usd=0.012, calls=1))
    await first.flush()

    again = ledger(path)
    total, split = await again.day(), await again.purposes()
    assert (total.input_tokens, total.calls) == (270, 3)
    assert {k: (u.input_tokens, u.calls) for k, u in split.items()} == {
        "chat": (220, 2),
        "compaction": (50, 1),
    }


async def test_a_ledger_written_before_purposes_counts_as_chat(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"
    old_day = {"input_tokens": 10, "output_tokens": 2, "cached_tokens": 0, "cost_usd": 0.1, "calls": 1}
    path.write_text(json.dumps({"version": 1, "days": {"2025-03-04": old_day}}))
    book = ledger(path)
    await book.record("consolidation", "m", Usage(5, 1, calls=1))
    assert (await book.day()).calls == 2
    assert {k: u.calls for k, u in (await book.purposes()).items()} == {"chat": 1, "consolidation": 1}


async def test_figures_never_flushed_are_counted_at_the_next_start(tmp_path: Path) -> None:
    """A kill between flushes loses nothing: every call is in the journal a moment after it is made."""
    path = tmp_path / "usage.json"
    await journaled(path, ("chat", Usage(100, 10, calls=1)), ("chat", Usage(20, 2, calls=1)))
    assert not path.exists()  # nothing rewritten on the reply path

    again = ledger(path)  # no flush, no close: the process was killed
    assert ((await again.day()).input_tokens, (await again.day()).calls) == (120, 2)
    await again.record("chat", "m", Usage(1, 1, calls=1))
    await again.close()
    assert json.loads(path.read_text())["journal"] == 3
    assert (await ledger(path).day()).calls == 3


async def test_a_journal_left_after_the_ledger_was_written_is_not_counted_twice(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"
    first = await journaled(path, ("chat", Usage(100, 10, calls=1)), ("compaction", Usage(50, 5, calls=1)))
    journal = path.with_name("usage.json.journal")
    lines = journal.read_bytes()
    await first.flush()
    assert journal.read_bytes() == b""
    journal.write_bytes(lines + b'{"line": 3, "day": "2025-03-04", "purpo')  # emptying lost; a torn line

    again = ledger(path)
    assert (await again.day()).calls == 2
    assert {k: u.calls for k, u in (await again.purposes()).items()} == {"chat": 1, "compaction": 1}
    await again.record("chat", "m", Usage(1, 1, calls=1))  # numbering goes on past what was read
    await again.written()
    assert json.loads(journal.read_bytes().splitlines()[-1])["line"] == 3


async def test_a_damaged_journal_line_costs_only_itself_and_is_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"
    await journaled(path, *[("chat", Usage(10, 1, calls=1))] * 3)
    journal = path.with_name("usage.json.journal")
    lines = journal.read_bytes().split(b"\n")
    damage = b'{"line": Infinity, "day": "2025-03-04", "purpose": "chat", "usage": {"calls": 1}}'
    lines[1] = damage
    journal.write_bytes(b"\n".join(lines))

    again = ledger(path)
    assert (await again.day()).calls == 2  # the other two calls still count
    await again.record("chat", "m", Usage(10, 1, calls=1))
    await again.flush()
    assert journal.read_bytes() == b""  # emptied by the flush, as before
    assert (await ledger(path).day()).calls == 3
    digest = hashlib.sha256(damage + b"\n").hexdigest()[:16]
    kept = path.with_name(f"usage.json.journal.damaged-{digest}")
    assert kept.read_bytes() == damage + b"\n"


async def test_a_close_storage_refuses_leaves_the_figures_to_the_journal_and_does_not_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flush at close raised when the disk refused usage.json, and with it the shutdown it is part
    of (``membot run`` ended a graceful stop with "error: … No space left on device", exit 1). The
    journal holds every figure: the next start counts them, as after a kill."""
    path = tmp_path / "usage.json"
    book = await journaled(path, ("chat", Usage(100, 10, calls=1)))
    real = os.fsync

    def fsync(fd: int) -> None:  # at the system call: the ledger's own code runs as it would
        if os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1].startswith(".usage.json."):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    await book.close()
    monkeypatch.undo()
    assert not path.exists()
    assert (await ledger(path).day()).calls == 1


async def test_a_ledger_from_a_newer_membot_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    """usage.json of a newer format (a rollback) was read as version 1 and rewritten at the next flush,
    its unknown fields dropped, and its journal folded by this version's rules. Now it is refused: the
    error names the file and the fix, it is logged once, and neither file changes."""
    path = tmp_path / "usage.json"
    day = {"input_tokens": 10, "output_tokens": 2, "cached_tokens": 0, "cost_usd": 0.1, "calls": 1}
    path.write_text(
        json.dumps({"version": 2, "journal": 3, "days": {"2025-03-04": day}, "budgets": {"x": 1}})
    )
    journal = tmp_path / "usage.json.journal"
    journal.write_bytes(b'{"line": 4, "v2": true}\n{"torn')
    before = (path.read_bytes(), journal.read_bytes())

    book = ledger(path)
    newer_membot = r"usage\.json was written by a newer membot \(format 2; this one reads up to 1\)"
    with capture_logs() as logs:
        await book.record("chat", "m", Usage(100, 10, calls=1))
        await book.record("chat", "m", Usage(100, 10, calls=1))
        with pytest.raises(StorageError, match=newer_membot) as refused:
            await book.day()
        with pytest.raises(StorageError, match=newer_membot):
            await book.purposes()
        await book.written()
        await book.flush()
        await book.close()

    assert "run that membot again, or restore a backup" in str(refused.value)
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["usage_ledger_refused"]
    assert (path.read_bytes(), journal.read_bytes()) == before
    assert sorted(await asyncio.to_thread(os.listdir, tmp_path)) == ["usage.json", "usage.json.journal"]
