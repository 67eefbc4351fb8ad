"""``membot memory edit`` beside a running bot: the bot's writes made while the editor is open survive.

An editor loads the file when it opens and writes its whole buffer back when it saves. Pointed at
MEMORY.md itself, it overwrote whatever the bot wrote meanwhile; the command now hands the editor a
copy and, when it exits, puts the result in place under the lock the bot takes for its own writes,
merging the bot's change into the operator's.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

# An editor: read the file, say so, wait to be told to save, save the buffer plus one line, say so.
EDITOR = """
import os, sys, time
path, signals = sys.argv[-1], os.environ["SIGNALS"]
buffer = open(path).read()
open(os.path.join(signals, "opened"), "w").close()
while not os.path.exists(os.path.join(signals, "save")):
    time.sleep(0.01)
with open(path, "w") as f:
    f.write(buffer + "- operator: the cat is called Miso\\n")
open(os.path.join(signals, "saved"), "w").close()
"""


def wait_for(path: Path, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, f"{path.name} never appeared"
        time.sleep(0.01)


def start_edit(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, Path]:
    ws, signals = tmp_path / "ws", tmp_path / "signals"
    signals.mkdir()
    memory_md = ws / "memory" / "MEMORY.md"
    memory_md.parent.mkdir(parents=True)
    memory_md.write_text("# Facts\n- likes tea\n")
    editor = tmp_path / "editor.py"
    editor.write_text(EDITOR)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBOT_") and k != "VISUAL"}
    env.update(
        MEMBOT_WORKSPACE=str(ws),
        HOME=str(tmp_path),
        EDITOR=f"{sys.executable} {editor}",
        SIGNALS=str(signals),
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "bot", "memory", "edit"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return process, memory_md, signals


def bot_write(memory_md: Path) -> None:
    """What the bot does meanwhile, in its own process: a memory-tool add."""
    code = (
        "import asyncio, sys; from pathlib import Path; from bot.memory.longterm import LongTermMemory\n"
        "m = LongTermMemory(Path(sys.argv[1]))\n"
        "asyncio.run(m.update(lambda t: t + '- bot: the user moved to Porto\\n'))\n"
    )
    subprocess.run([sys.executable, "-c", code, str(memory_md)], check=True, timeout=60)


def test_a_bot_write_made_while_the_editor_is_open_survives_the_save(tmp_path: Path) -> None:
    process, memory_md, signals = start_edit(tmp_path)
    wait_for(signals / "opened")
    bot_write(memory_md)
    (signals / "save").touch()
    out, err = process.communicate(timeout=60)

    assert process.returncode == 0, err
    lines = memory_md.read_text().splitlines()
    assert "- operator: the cat is called Miso" in lines
    assert "- bot: the user moved to Porto" in lines  # was overwritten by the editor's save
    assert "merged" in out
    assert oct(memory_md.stat().st_mode & 0o777) == "0o600"


def test_the_edit_waits_for_the_lock_the_bot_holds(tmp_path: Path) -> None:
    process, memory_md, signals = start_edit(tmp_path)
    wait_for(signals / "opened")
    lock_path = memory_md.with_name(".MEMORY.md.lock")  # the lock the bot's writes take
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the bot is in the middle of a write
        (signals / "save").touch()
        wait_for(signals / "saved")
        time.sleep(0.5)
        assert process.poll() is None, "membot memory edit did not wait for the bot's write to finish"
        assert "Miso" not in memory_md.read_text()
        memory_md.write_text("# Facts\n- likes tea\n- bot: written under the lock\n")  # the bot's write
    finally:
        os.close(fd)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    lines = memory_md.read_text().splitlines()
    assert "- operator: the cat is called Miso" in lines and "- bot: written under the lock" in lines
