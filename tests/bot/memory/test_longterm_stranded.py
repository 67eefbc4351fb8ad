"""An operator's save left under a bot swap's temp name (the exchange back failed) is merged back, never deleted.

The failure is injected at the system call (``renameat2``, the C library function that
``bot/memory/exchange.py`` calls): an editor saves by rename in the instant between the bot's look at
MEMORY.md and its exchange, and the exchange back that should put the editor's version in place again
fails (EIO). Our code runs as it would; what is on disk afterwards is what such a failure leaves.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from bot.config import load_settings
from bot.memory import exchange, late_edits
from bot.memory.longterm import LongTermMemory
from bot.startup import prepare_workspace

pytestmark = pytest.mark.skipif(not exchange.AVAILABLE, reason="renameat2/statx are Linux-only")

BASE = "- likes tea\n- lives in Lyon\n"
SAVED = "- likes tea\n- lives in Porto\n"  # the operator's save: Lyon corrected to Porto


def strand_the_exchange_back(monkeypatch: pytest.MonkeyPatch, path: Path, saved: str) -> None:
    """The editor saves ``saved`` by rename just before the bot's exchange; the exchange back fails."""
    rename, statx, open_ = exchange._CALLS  # type: ignore[misc]
    calls = 0

    def renameat2(olddir: int, old: bytes, newdir: int, new: bytes, flags: int) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:  # another program's save, landing after the bot's look
            editor_temp = path.with_name("MEMORY.md.swp")
            editor_temp.write_text(saved)
            os.replace(editor_temp, path)
        elif calls == 2:
            ctypes.set_errno(errno.EIO)
            return -1
        return int(rename(olddir, old, newdir, new, flags))

    monkeypatch.setattr(exchange, "_CALLS", (renameat2, statx, open_))


def write_base(path: Path) -> LongTermMemory:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(BASE)
    return LongTermMemory(path)


async def strand_an_operator_save(monkeypatch: pytest.MonkeyPatch, path: Path) -> LongTermMemory:
    memory = await asyncio.to_thread(write_base, path)
    strand_the_exchange_back(monkeypatch, path, SAVED)
    with pytest.raises(OSError, match="could not put the newer version back"):
        await memory.update(lambda text: text + "- bot fact\n")
    monkeypatch.undo()
    in_place = await asyncio.to_thread(path.read_text)
    assert in_place == BASE + "- bot fact\n"  # the bot's version is in place, the operator's save is not
    return memory


async def test_a_stranded_operator_save_is_merged_back_by_the_next_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bot knows what its write was based on: the operator's change is applied, and its fact kept."""
    path = tmp_path / "memory" / "MEMORY.md"
    memory = await strand_an_operator_save(monkeypatch, path)

    with capture_logs() as logs:
        lines = (await memory.read()).text.splitlines()

    assert lines == ["- likes tea", "- bot fact", "- lives in Porto"]
    assert path.read_text().splitlines() == lines
    assert sorted(p.name for p in path.parent.iterdir()) == [
        ".MEMORY.md.lock",
        "MEMORY.md",
        "MEMORY.replaced.md",
    ]
    assert "memory_stranded_version_merged" in [e["event"] for e in logs]


async def test_a_stranded_operator_save_survives_the_start_up_cleanup_of_a_later_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process ends before it reads MEMORY.md again; it starts an hour later. The start-up removes
    temp files older than a minute (bot/storage.py): the operator's save must not be one of them."""
    workspace = tmp_path / "ws"
    path = workspace / "memory" / "MEMORY.md"
    await strand_an_operator_save(monkeypatch, path)
    an_hour_ago = time.time() - 3600
    for entry in path.parent.iterdir():
        os.utime(entry, (an_hour_ago, an_hour_ago))

    settings = await asyncio.to_thread(load_settings, None, env_file=None, overrides={"workspace": workspace})
    await asyncio.to_thread(prepare_workspace, settings)
    lines = (await LongTermMemory(path).read()).text.splitlines()

    # What the save was based on is gone with the process: every line of both versions is kept.
    assert "- lives in Porto" in lines and lines[:3] == ["- likes tea", "- lives in Lyon", "- bot fact"]
    assert path.read_text().splitlines() == lines
    assert not [
        p.name for p in path.parent.iterdir() if p.name.startswith(".MEMORY.md.") and "lock" not in p.name
    ]


async def killed_writing(tmp_path: Path, script: str) -> Path:
    """MEMORY.md (holding ``BASE``) after a child process ran ``script`` on it and was SIGKILLed."""
    path = tmp_path / "memory" / "MEMORY.md"
    path.parent.mkdir()
    path.write_text(BASE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [sys.executable, "-c", script, str(path)]
    killed = await asyncio.to_thread(subprocess.run, args, env=env, capture_output=True, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    return path


KILLED_BEFORE_THE_EXCHANGE = r"""
import asyncio, os, signal, sys
from pathlib import Path
from bot.memory import exchange
from bot.memory.longterm import LongTermMemory

def renameat2(*args):
    os.kill(os.getpid(), signal.SIGKILL)  # killed with the bot's new version written, not yet in place

exchange._CALLS = (renameat2, *exchange._CALLS[1:])
asyncio.run(LongTermMemory(Path(sys.argv[1])).update(lambda text: text + "- bot fact\n"))
"""


async def test_the_bots_own_version_left_by_a_kill_is_removed_not_merged(tmp_path: Path) -> None:
    """Only a version that is not the bot's is merged back: the bot's own, never put in place, would bring
    back a line the operator deleted after the kill."""
    path = await killed_writing(tmp_path, KILLED_BEFORE_THE_EXCHANGE)
    assert [
        p.name for p in path.parent.iterdir() if p.name.startswith(".MEMORY.md.") and "lock" not in p.name
    ]
    path.write_text("- likes tea\n")  # the operator deletes a line meanwhile

    assert (await LongTermMemory(path).read()).text == "- likes tea\n"
    assert sorted(p.name for p in path.parent.iterdir()) == [".MEMORY.md.lock", "MEMORY.md"]


KILLED_AFTER_THE_EXCHANGE = r"""
import asyncio, os, signal, sys
from pathlib import Path
from bot.memory import exchange
from bot.memory.longterm import LongTermMemory

rename = exchange._CALLS[0]

def renameat2(*args):
    done = rename(*args)
    os.kill(os.getpid(), signal.SIGKILL)  # the bot's version in place, the one it displaced not let go yet
    return done

exchange._CALLS = (renameat2, *exchange._CALLS[1:])
asyncio.run(LongTermMemory(Path(sys.argv[1])).update(lambda text: text.replace("- lives in Lyon\n", "")))
"""


async def test_the_version_a_write_displaced_left_by_a_kill_does_not_undo_the_write(tmp_path: Path) -> None:
    """A kill between the exchange and the letting go of the version it displaced left that version
    under the temp name; merged back, it brought back the line the write (a consolidation, an operator's
    ``membot memory edit``) had just removed."""
    path = await killed_writing(tmp_path, KILLED_AFTER_THE_EXCHANGE)
    assert path.read_text() == "- likes tea\n"  # the write is in place
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".swap")]  # and the displaced one left

    assert (await LongTermMemory(path).read()).text == "- likes tea\n"
    assert not [p.name for p in path.parent.iterdir() if p.name.endswith(".swap")]


async def test_an_edit_that_cannot_be_merged_yet_is_not_tried_again_at_every_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator saved MEMORY.md in another encoding meanwhile: the stranded save cannot be merged
    until they save it as UTF-8 again, and each turn's read took the locks, tried and logged an error."""
    path = tmp_path / "memory" / "MEMORY.md"
    memory = await strand_an_operator_save(monkeypatch, path)
    await asyncio.to_thread(path.write_bytes, "- caf\xe9\n".encode("latin-1"))

    with capture_logs() as logs:
        for _ in range(20):
            await memory.read()

    tries = [e for e in logs if e["event"] == "memory_file_not_utf8" and e.get("log_level") == "error"]
    assert len(tries) == 1
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".swap")]  # kept for a later try


def swap_files(path: Path) -> list[str]:
    return [p.name for p in path.parent.iterdir() if p.name.endswith(".swap")]


async def test_a_stranded_save_waits_while_the_file_is_past_what_the_bot_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator pasted 8 MB into MEMORY.md meanwhile. The merge of their stranded save read it whole
    and wrote it back; it now leaves the file alone, says so, and merges once the file is shortened."""
    path = tmp_path / "memory" / "MEMORY.md"
    memory = await strand_an_operator_save(monkeypatch, path)
    monkeypatch.setattr(late_edits, "DEFER_PAUSE", 0.0)  # a read tries again at once, not 30 s later
    os.truncate(path, 8 << 20)  # sparse: no disk
    before = path.stat()

    with capture_logs() as logs:
        snap = await memory.read()

    assert snap.text == BASE + "- bot fact\n" and not snap.whole
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    assert swap_files(path)  # the operator's save, still beside the file
    [waiting] = [e for e in logs if e["event"] == "memory_late_edit_waiting"]
    assert "shorten MEMORY.md" in waiting["hint"]

    path.write_text(BASE + "- bot fact\n")  # the operator cuts the paste out
    lines = (await memory.read()).text.splitlines()

    assert lines == ["- likes tea", "- bot fact", "- lives in Porto"]
    assert path.read_text().splitlines() == lines and not swap_files(path)


READ_IN_A_SMALL_PROCESS = r"""
import asyncio, json, resource, sys
from pathlib import Path
from structlog.testing import capture_logs
from bot.memory.longterm import LongTermMemory

resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # a small host: 1 GB for the whole process
with capture_logs() as logs:
    snap = asyncio.run(LongTermMemory(Path(sys.argv[1])).read())
print(json.dumps({"text": snap.text, "events": [e["event"] for e in logs]}))
"""


async def test_a_stranded_save_beside_a_multi_gigabyte_file_does_not_take_the_process_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next start finds the operator's stranded save and a 4 GB MEMORY.md: the merge read it whole."""
    path = tmp_path / "memory" / "MEMORY.md"
    await strand_an_operator_save(monkeypatch, path)
    os.truncate(path, 4 << 30)  # sparse: no disk
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [sys.executable, "-c", READ_IN_A_SMALL_PROCESS, str(path)]

    done = await asyncio.to_thread(subprocess.run, args, env=env, capture_output=True, check=False)

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    read = json.loads(done.stdout.decode().splitlines()[-1])
    assert read["text"] == BASE + "- bot fact\n" and "memory_late_edit_waiting" in read["events"]
    assert path.stat().st_size == 4 << 30 and swap_files(path)
