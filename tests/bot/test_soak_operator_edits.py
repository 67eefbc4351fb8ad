"""Soak: an operator edits MEMORY.md and today's daily note while the real ``membot run`` answers,
writes the same files and is killed (SIGKILL) at random points.

Every line the operator added and did not take out must be there at the end, and none they took out
may come back: the bot merges its own writes into whatever the operator saved, whenever and however
they saved it (an editor's rename, or a write in place).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import time
from pathlib import Path
from typing import Any

from tests.bot.membot_service import membot_run, telegram_env
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.telegram_server import FakeTelegramServer

CHATS = (801, 802)
KILLS = 5
KILL_PHASE = 30.0  # seconds at most for the kill rounds
TOKEN = re.compile(r"tok\d{5}")
DAY_NOTE = re.compile(r"^\d{4}-\d{2}-\d{2}\.md$")


def model(rng: random.Random) -> Any:
    """Echoes the new user messages' tokens; asked to note one, first appends it to MEMORY.md."""

    def respond(api: str, body: dict[str, Any]) -> FakeReply:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return FakeReply(text="noted", delay=rng.uniform(0.0, 0.2))
        text = last["content"] if isinstance(last["content"], str) else json.dumps(last["content"])
        tokens = sorted(set(TOKEN.findall(text)))
        if "note" in text and tokens:
            args = {"action": "append", "path": "memory/MEMORY.md", "content": f"- bot {tokens[0]}"}
            return FakeReply(tool_calls=[("files", args)], delay=rng.uniform(0.0, 0.2))
        return FakeReply(text="echo: " + " ".join(tokens), delay=rng.uniform(0.0, 0.3))

    return respond


def save(path: Path, text: str, rng: random.Random) -> None:
    """As editors save: a new file renamed over the old one, or the old one rewritten in place."""
    if rng.random() < 0.5:
        tmp = path.with_name(path.name + ".swp-op")
        tmp.write_text(text)
        os.replace(tmp, path)
    else:
        with open(path, "r+") as f:
            f.seek(0)
            f.write(text)
            f.truncate()


class Operator:
    def __init__(self, memory: Path, rng: random.Random) -> None:
        self.memory, self.rng = memory, rng
        self.kept: dict[str, set[str]] = {}  # file name -> the operator's lines that must be there
        self.dropped: dict[str, set[str]] = {}
        self.n = 0

    def edit_once(self) -> None:
        names = ["MEMORY.md", *sorted(p.name for p in self.memory.glob("*.md") if DAY_NOTE.match(p.name))]
        name = self.rng.choice(names)
        path = self.memory / name
        if not path.exists():
            return
        text = path.read_text()
        lines = text.splitlines()
        kept, dropped = self.kept.setdefault(name, set()), self.dropped.setdefault(name, set())
        if kept and self.rng.random() < 0.3:
            line = self.rng.choice(sorted(kept))
            if line in lines:
                lines.remove(line)
                kept.discard(line)
                dropped.add(line)
        else:
            self.n += 1
            line = f"- operator line {self.n:04d}"
            at = self.rng.randrange(len(lines) + 1)
            lines.insert(at, line)
            kept.add(line)
        save(path, "\n".join(lines) + "\n", self.rng)


async def operate(op: Operator, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(op.edit_once)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(op.rng.uniform(0.1, 0.5)):
                await stop.wait()


async def write_messages(
    tg: FakeTelegramServer, rng: random.Random, sent: list[str], stop: asyncio.Event
) -> None:
    while not stop.is_set() and len(sent) < 150:
        token = f"tok{len(sent):05d}"
        sent.append(token)
        verb = "please note" if rng.random() < 0.3 else "message"
        tg.push_message(f"{verb} {token}", chat_id=rng.choice(CHATS), user_id=42)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(rng.uniform(0.1, 0.3)):
                await stop.wait()


async def test_operator_edits_survive_random_kills_while_the_bot_writes_the_same_files(
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("MEMBOT_SOAK_SEED") or random.SystemRandom().randrange(1, 10**6))
    rng = random.Random(seed)
    print(f"soak seed {seed}")
    workspace = tmp_path / "ws"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "memory" / "MEMORY.md").write_text("# Memory\n")
    op = Operator(workspace / "memory", rng)
    sent: list[str] = []
    kills = 0
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.responder = model(rng)
        env = telegram_env(tg, MEMBOT_TELEGRAM__POLL_TIMEOUT="2")
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(write_messages(tg, rng, sent, stop)),
            asyncio.create_task(operate(op, stop)),
        ]
        end = time.monotonic() + KILL_PHASE
        while kills < KILLS and time.monotonic() < end:
            async with membot_run(workspace, llm, ready=None, **env) as service:
                with contextlib.suppress(TimeoutError):
                    await service.wait_log("telegram_started", timeout=30)
                await asyncio.sleep(rng.uniform(0.5, 4.0))
                await service.kill()
                kills += 1
            await asyncio.sleep(rng.uniform(0.0, 1.0))
        stop.set()
        await asyncio.gather(*tasks)
        async with membot_run(workspace, llm, **env) as service:
            answered = lambda: {t for m in tg.messages.values() for t in TOKEN.findall(m.text)}  # noqa: E731
            with contextlib.suppress(TimeoutError):
                await tg.wait_for(lambda: set(sent) <= answered(), timeout=40)
            service.process.send_signal(signal.SIGTERM)
            code, _ = await service.finish()
            stderr = service.stderr
    problems = []
    for name, kept in op.kept.items():
        text = (workspace / "memory" / name).read_text().splitlines()
        missing = sorted(line for line in kept if line not in text)
        back = sorted(line for line in op.dropped.get(name, ()) if line in text)
        twice = sorted(line for line in set(text) if line.startswith("- ") and text.count(line) > 1)
        if missing or back or twice:
            problems.append(f"{name}: missing {missing}, came back {back}, twice {twice}")
    memory_md = (workspace / "memory" / "MEMORY.md").read_text()
    notes = sorted(p.name for p in (workspace / "memory").glob("*.md") if DAY_NOTE.match(p.name))
    print(
        f"seed {seed}: {kills} kills, {op.n} operator lines, {len(sent)} messages, exit {code}, "
        f"bot lines in MEMORY.md {memory_md.count('- bot tok')}, daily notes {notes}, "
        f"kept per file { {k: len(v) for k, v in op.kept.items()} }"
    )
    assert code == 0, stderr[-3000:]
    assert not problems, f"seed {seed}\n" + "\n".join(problems)
