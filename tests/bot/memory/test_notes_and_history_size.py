"""Daily notes and HISTORY.md far larger than the bot ever makes them: read a piece at a time, never whole.

Both are the operator's to edit, and the bot reads them back (a note file to count today's notes for
``/status`` and to skip lines a replay already wrote, HISTORY.md to skip an entry a resumed consolidation
already wrote). Read whole, a multi-GB one took the process down: each test reads a 1 GB one in a
process given half that.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

NOTE = "[09:00] User: hi | Assistant: hello"

SMALL_PROCESS = r"""
import asyncio, json, resource, sys
from datetime import date, datetime
from pathlib import Path
from zoneinfo import ZoneInfo
from bot.memory.history import HistoryLog
from bot.memory.notes import DailyNotes, not_yet_in

resource.setrlimit(resource.RLIMIT_AS, (1 << 29, 1 << 29))  # a small host: 512 MB for the whole process
folder, NOTE = Path(sys.argv[1]), sys.argv[2]
if sys.argv[3] == "notes":
    notes = DailyNotes(folder, ZoneInfo("UTC"))
    out = {
        "new": not_yet_in(notes.path_for(date(2024, 5, 20)), [NOTE, "[10:00] User: more"]),
        "last": asyncio.run(notes.read_day(date(2024, 5, 20), max_lines=1)),
    }
else:
    asyncio.run(HistoryLog(folder).append(datetime(2024, 5, 20, 9), "cli:me", "Talked.", once=True))
    out = {}
print(json.dumps(out))
"""


async def in_a_small_process(folder: Path, what: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [sys.executable, "-c", SMALL_PROCESS, str(folder), NOTE, what]
    done = await asyncio.to_thread(subprocess.run, args, env=env, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    out: dict[str, object] = json.loads(done.stdout.decode().splitlines()[-1])
    return out


def sparse(path: Path, head: bytes, size: int, tail: bytes = b"") -> None:
    """``head``, zeros up to ``size`` bytes (no disk, no memory), then ``tail``."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
        f.seek(size)
        f.write(tail)


async def test_a_gigabyte_daily_note_is_read_a_line_at_a_time(tmp_path: Path) -> None:
    note = tmp_path / "2024-05-20.md"
    await asyncio.to_thread(sparse, note, f"{NOTE}\n".encode(), 1 << 30, b"\n[23:59] User: last\n")

    out = await in_a_small_process(tmp_path, "notes")

    assert out["new"] == ["[10:00] User: more"]  # the line already there is not written again
    assert out["last"] == ["[23:59] User: last"]


async def test_a_gigabyte_history_is_searched_a_piece_at_a_time(tmp_path: Path) -> None:
    """A resumed consolidation looks for its entry before it appends it again."""
    entry = "## 2024-05-20T09:00:00 — cli:me\n\nTalked.\n\n"
    history = tmp_path / "HISTORY.md"
    await asyncio.to_thread(sparse, history, b"# History\n", 1 << 30, entry.encode())

    await in_a_small_process(tmp_path, "history")

    assert history.stat().st_size == (1 << 30) + len(entry.encode())  # found: not appended again
    assert (tmp_path / "HISTORY-2024-05.md").read_text() == entry  # not there yet: appended
