"""A MEMORY.md far past its limit (an operator's paste, a runaway script): the bot reads only its start.

Read whole, a multi-GB file took the process down with every chat in it. The operator's file is never
cut or rewritten: the bot shows the model its start, says so in the log, and does not write it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from bot.memory.longterm import READ_MARGIN, Limits, LongTermMemory, MemoryFull

HEAD = "- likes tea\n- lives in Porto\n"


def oversized(path: Path, size: int) -> tuple[int, int]:
    """MEMORY.md: two facts, then zeros up to ``size`` bytes (a sparse file: no disk, no memory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(HEAD.encode())
        f.truncate(size)
    info = path.stat()
    return info.st_size, info.st_mtime_ns


async def test_a_file_past_what_the_bot_reads_shows_its_start_and_is_never_written(tmp_path: Path) -> None:
    path = tmp_path / "memory" / "MEMORY.md"
    limits = Limits(max_bytes=4096)
    size = 8 << 20  # more than the limit and the margin the bot reads past it
    before = await asyncio.to_thread(oversized, path, size)
    memory = LongTermMemory(path, limits=limits)

    with capture_logs() as logs:
        snap = await memory.read()
        with pytest.raises(MemoryFull, match="more than the bot reads"):
            await memory.update(lambda text: text.replace("- likes tea\n", ""))

    assert snap.text == HEAD and snap.size == size and not snap.whole
    too_large = [e for e in logs if e["event"] == "memory_file_too_large"]
    assert too_large and too_large[0]["bytes"] == size
    assert await asyncio.to_thread(lambda: (path.stat().st_size, path.stat().st_mtime_ns)) == before
    assert not (tmp_path / "memory" / "MEMORY.replaced.md").exists()


async def test_no_write_makes_the_file_more_than_the_bot_reads(tmp_path: Path) -> None:
    """Not even the operator's through ``membot memory edit``: the bot would read back only its start."""
    path = tmp_path / "memory" / "MEMORY.md"
    path.parent.mkdir()
    path.write_text(HEAD)
    memory = LongTermMemory(path, limits=Limits(max_bytes=4096))
    pasted = HEAD + "- x\n" * ((4096 + READ_MARGIN) // 4)

    with pytest.raises(MemoryFull, match="more than the bot reads"):
        await asyncio.to_thread(memory.apply_operator_edit, HEAD, pasted)

    assert path.read_text() == HEAD


READ_IN_A_SMALL_PROCESS = r"""
import asyncio, json, resource, sys
from pathlib import Path
from bot.memory.longterm import LongTermMemory

resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # a small host: 1 GB for the whole process
snap = asyncio.run(LongTermMemory(Path(sys.argv[1])).read())
print(json.dumps({"text": snap.text}))
"""


async def test_a_multi_gigabyte_file_does_not_take_the_process_down(tmp_path: Path) -> None:
    path = tmp_path / "memory" / "MEMORY.md"
    await asyncio.to_thread(oversized, path, 4 << 30)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [sys.executable, "-c", READ_IN_A_SMALL_PROCESS, str(path)]

    done = await asyncio.to_thread(subprocess.run, args, env=env, capture_output=True, check=False)

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert json.loads(done.stdout.decode().splitlines()[-1]) == {"text": HEAD}


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "plain-rename"])
async def test_a_late_write_past_what_the_bot_reads_is_kept_beside_the_file_not_merged(
    tmp_path: Path, exchange: bool
) -> None:
    """An editor that had the file open writes 8 MB into the version a bot write replaced. Merged, it was
    read whole and written back into MEMORY.md; it is copied beside the file instead, for the operator."""
    path = tmp_path / "memory" / "MEMORY.md"
    path.parent.mkdir()
    path.write_text(HEAD)
    memory = LongTermMemory(path, limits=Limits(max_bytes=4096), exchange=exchange)
    late = "- operator: allergic to nuts\n"
    with open(path, "a") as editor:  # the editor, another program, had the file open
        await memory.update(lambda text: text + "- bot fact\n")
        editor.write(late)
        editor.truncate(8 << 20)  # and a paste of 8 MB (sparse: no disk)

    with capture_logs() as logs:
        snap = await memory.read()

    assert snap.text == HEAD + "- bot fact\n" and path.read_text() == snap.text
    [kept] = [p for p in path.parent.iterdir() if p.name.endswith(".swap")]
    assert kept.stat().st_size == 8 << 20
    with open(kept, "rb") as f:
        assert f.read(100).rstrip(b"\0") == (HEAD + late).encode()
    [event] = [e for e in logs if e["event"] == "memory_late_edit_too_large"]
    assert event["kept"] == str(kept) and "merge what you need" in event["hint"]

    # The operator cuts the paste from the copy: the bot's next start merges what is left of it.
    os.truncate(kept, len(HEAD + late))
    lines = (await LongTermMemory(path, limits=Limits(max_bytes=4096)).read()).text.splitlines()

    assert lines == ["- likes tea", "- lives in Porto", "- bot fact", "- operator: allergic to nuts"]
    assert not kept.exists()
