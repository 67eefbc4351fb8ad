"""Start-up and footprint: ``membot --help`` time, ``membot run`` time to ready, idle RSS.

Each figure is the median of several runs of the real command in a fresh process:

- ``--help``: exec of the ``membot`` script until it exits, and its CPU time (the interpreter's own
  start, ``python -c pass``, is printed beside it as the floor);
- ``run``: ``membot run`` with the Telegram channel against the fake Bot API (tests/fakes/, in this
  process, answering at once) and an instant model server (instant_llm.py); a message is already
  waiting when the process starts. Printed: exec until the ``membot_started`` log line (channels
  started, inbox recovered: ready) with the CPU time the process used until then (robust on a busy
  machine, where wall times mostly measure waiting), and exec until the reply to the waiting message
  reached the fake (with ``telegram.join_window = 0``: the 1 s the channel waits for the rest of a
  split paste is a deliberate delay, not start-up);
- idle RSS: the ``membot run`` process's resident memory once it is idle after that reply: at least
  2 s on, and no CPU used for a whole second (the reply's memory is recorded, and the query's model
  loaded, in the background after it goes out; the heap is trimmed after that). Reading at a fixed 2 s
  on a busy machine caught that work half done: 221 or 240 MiB for the same code.

    python bench/startup.py [--runs 5] [--memory on|off]

Targets (issue 19): --help <= 0.3 s, ready <= 2 s, idle RSS <= 100 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from instant_llm import InstantLLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fakes, from a checkout

from tests.fakes.telegram_server import FakeTelegramServer

CHAT = 777
USER = 42
SETTLE = 2.0  # seconds at least between the reply and the RSS reading
QUIET = 1.0  # ... the last of them without any CPU used
SETTLE_MAX = 30.0  # a process never quiet this long is read anyway (and said so)


def membot_command() -> list[str]:
    """The installed ``membot`` script next to this interpreter, else ``python -m bot``."""
    script = Path(sys.executable).with_name("membot")
    return [str(script)] if script.exists() else [sys.executable, "-m", "bot"]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBOT_")}
    env.update(extra)
    return env


def timed_exec(command: list[str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of running ``command`` to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd=cwd)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def settle(pid: int) -> float:
    """Seconds waited until the process was idle (see the module doc)."""
    started = time.perf_counter()
    await asyncio.sleep(SETTLE - QUIET)
    while True:
        before = cpu_seconds(pid)
        await asyncio.sleep(QUIET)
        waited = time.perf_counter() - started
        if cpu_seconds(pid) == before or waited >= SETTLE_MAX:
            if waited >= SETTLE_MAX:
                print(f"  (the process still used CPU after {waited:.0f} s: RSS read anyway)")
            return waited


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc (Linux only)")


async def one_run(
    tg: FakeTelegramServer, llm: InstantLLM, workspace: Path, *, memory: bool
) -> tuple[float, float, float, float]:
    """(seconds to ready, CPU seconds to ready, seconds to the first reply, idle RSS MiB) of one run."""
    env = clean_env(
        HOME=str(workspace.parent),
        MEMBOT_WORKSPACE=str(workspace),
        MEMBOT_LOG_FORMAT="json",
        MEMBOT_LLM__OPENAI__BASE_URL=llm.openai_base_url,
        MEMBOT_LLM__OPENAI__API_KEY="sk-bench-not-used",
        MEMBOT_MEMORY__ENABLED=str(memory).lower(),
        MEMBOT_TELEGRAM__TOKEN=tg.token,
        MEMBOT_TELEGRAM__BASE_URL=tg.base_url,
        MEMBOT_TELEGRAM__BASE_FILE_URL=tg.base_file_url,
        MEMBOT_TELEGRAM__ALLOWED_USERS=f'["{USER}"]',
        # Not start-up: the channel deliberately waits join_window (1 s) for the rest of a split paste.
        MEMBOT_TELEGRAM__JOIN_WINDOW="0",
    )
    answered = len(tg.sent_to(CHAT))
    tg.push_message("are you there?", chat_id=CHAT, user_id=USER)
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *membot_command(),
        "run",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=workspace.parent,
    )
    log: list[str] = []
    try:
        assert process.stderr is not None
        async with asyncio.timeout(120):
            while True:
                line = (await process.stderr.readline()).decode("utf-8", "replace")
                if not line:
                    raise RuntimeError("membot run exited before it was ready:\n" + "".join(log))
                log.append(line)
                if '"event": "membot_started"' in line:
                    ready = time.perf_counter() - started
                    ready_cpu = cpu_seconds(process.pid)
                    break
            await tg.wait_for(lambda: len(tg.sent_to(CHAT)) > answered, timeout=120)
            first_reply = time.perf_counter() - started
        drain = asyncio.create_task(process.stderr.read())  # keep the pipe from filling up
        await settle(process.pid)
        rss = rss_mib(process.pid)
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            await process.wait()
        await drain
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return ready, ready_cpu, first_reply, rss


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--memory", choices=["on", "off"], default="on", help="memory for `membot run`")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        floor = [timed_exec([sys.executable, "-c", "pass"], root) for _ in range(args.runs)]
        helps = [timed_exec([*membot_command(), "--help"], root) for _ in range(args.runs)]
        runs = []
        with InstantLLM() as llm:
            async with FakeTelegramServer() as tg:
                for i in range(args.runs):
                    workspace = root / f"ws{i}"
                    runs.append(await one_run(tg, llm, workspace, memory=args.memory == "on"))
                    shutil.rmtree(workspace, ignore_errors=True)
    ready, ready_cpu, first, rss = (statistics.median(column) for column in zip(*runs, strict=True))
    print(f"start-up, median of {args.runs} runs (memory {args.memory})")
    help_wall, help_cpu = (statistics.median(column) for column in zip(*helps, strict=True))
    floor_wall, floor_cpu = (statistics.median(column) for column in zip(*floor, strict=True))
    print(f"  membot --help          {help_wall:6.3f} s   (python -c pass: {floor_wall:.3f} s)")
    print(f"           CPU           {help_cpu:6.3f} s   (python -c pass: {floor_cpu:.3f} s)")
    print(f"  membot run: ready      {ready:6.3f} s   (exec to the membot_started log line)")
    print(f"           CPU to ready  {ready_cpu:6.3f} s   (the process's user + system time until then)")
    print(f"  membot run: 1st reply  {first:6.3f} s   (exec to the reply to a message waiting at start)")
    print(
        f"  idle RSS               {rss:6.1f} MiB (once idle after that reply: >= {SETTLE:g} s, the last {QUIET:g} s without CPU)"
    )
    print("targets: --help <= 0.3 s, ready <= 2 s, idle RSS <= 100 MiB")


if __name__ == "__main__":
    asyncio.run(main())
