"""Chaos soak: the real ``membot run`` killed (SIGKILL) or stopped (SIGTERM) at random moments while
three Telegram chats write, and everything that can be in flight at a kill is in flight now and then.

The model is a small window (``tiny-local``, so AutoCompaction summarizes long chats), a short memory
window (so trims retire messages into a consolidation) and a fake that, at random, fails with HTTP 500,
answers too late for ``llm.timeout``, asks for a memory tool write (an append to MEMORY.md), or gives an
answer too long for one Telegram message (sent in chunks); answers pause midway, so a kill finds one
half read (and, in the ``streamed`` run, half shown in a preview). Users now and then send ``/new``.
Between the runs, and now and then while one runs, the operator adds lines to ``memory/MEMORY.md``.
About a quarter of the stops are SIGTERM, some cut short by a SIGKILL. A last run drains everything and
stops gracefully. Then:

- every message Telegram handed over (all of them: the last run confirms every update) is answered,
  every line of a long answer included;
- no answer, and no line of a long one, went out twice, except the one window the design leaves (an
  answer Telegram took just before a SIGKILL, its done mark not on disk yet: tests/bot/test_soak.py);
  a SIGTERM leaves none;
- each ``/new`` got exactly one reply (one taken during a shutdown is asked for again: that counts);
- every JSON / JSON-lines file and session parses, and no ``*_unreadable`` was logged;
- every line the operator added to MEMORY.md is there, and no line the bot's tool appended is there
  twice.

Seeded (``MEMBOT_SOAK_SEED`` replays a run); the seed and the counts are printed, and each run's log
and the bot's messages are left in ``tmp_path`` for a look at a failure. The messages are short enough
that a turn's batch fits the small window whole: a batch larger than the window is cut to fit (the
model then never sees some of it), which is no durability matter. Written the done mark before the
send (bot/dispatcher/delivery.py), this test fails with lost answers and cut long ones.
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
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from bot.compaction import SUMMARY_SYSTEM
from tests.bot.membot_service import Service, membot_run, telegram_env
from tests.bot.test_soak import TOKEN, TimedTelegram, corrupt_files
from tests.bot.test_soak_operator_edits import save
from tests.fakes.llm_server import FakeLLMServer, FakeReply

CHATS = (901, 902, 903)
CYCLES = 40
PHASE = 30.0  # seconds at most for the kill rounds
MAX_MESSAGES = 200
EDGE = 2.0  # seconds from the platform's record of a send to a SIGKILL that may repeat it
LLM_TIMEOUT = 1.5
MODEL = "tiny-local"
WINDOW = 4000
LONG_LINES = 50
KEY = re.compile(r"^((?:tok\d{5} ?)+) L(\d+)/(\d+)", re.MULTILINE)
CLEARED = (
    "Session cleared.",
    "I couldn't save this conversation to memory",
    "I'm restarting — please send that command",
    "/new is done.",  # it ran, and a kill (or a shutdown's end) came before its reply was kept
)


def new_user_text(body: dict[str, Any]) -> str:
    """The user messages since the last answer. A tool round is none: a turn that waited for the model
    after its tool ran is tried again with the messages sent meanwhile after that round, and answers
    them all."""
    texts: list[str] = []
    for message in reversed(body["messages"]):
        if message["role"] == "assistant" and message.get("content") and not message.get("tool_calls"):
            break
        if message["role"] == "user":
            content = message["content"]
            texts.append(content if isinstance(content, str) else json.dumps(content))
    return " ".join(texts)


def tool_ran(body: dict[str, Any]) -> bool:
    """Whether a tool ran since the last answer (a turn tried again after it waited for the model)."""
    for message in reversed(body["messages"]):
        if message["role"] == "assistant" and message.get("content") and not message.get("tool_calls"):
            return False
        if message["role"] == "tool":
            return True
    return False


def chaotic_model(rng: random.Random, counts: Counter[str]) -> Any:
    """Compaction summaries and consolidations (each failing now and then), and turns that fail, time
    out, write to MEMORY.md, answer at length or echo the tokens of the new user messages."""

    def respond(api: str, body: dict[str, Any]) -> FakeReply:
        first = body["messages"][0]
        roll = rng.random()
        if first["role"] == "system" and first["content"] == SUMMARY_SYSTEM:
            counts["compaction"] += 1
            if roll < 0.15:
                return FakeReply(status=500)
            return FakeReply(text="- the user sent numbered messages", delay=rng.uniform(0.0, 0.5))
        if "memory consolidation step" in json.dumps(first):
            counts["consolidation"] += 1
            if roll < 0.15:
                return FakeReply(status=500)
            prompt = body["messages"][-1]["content"]
            current = prompt.split("## Current MEMORY.md\n", 1)[1].split("\n\n## Conversation", 1)[0]
            current = "" if current == "(empty)" else current
            if rng.random() < 0.5:
                current += f"\n- fact {counts['consolidation']}"
            reply = {"history_entry": "The user sent numbered messages.", "memory_update": current + "\n"}
            return FakeReply(text=json.dumps(reply), delay=rng.uniform(0.0, 1.0))
        last = body["messages"][-1]
        if last["role"] == "tool":
            tokens = sorted(set(TOKEN.findall(new_user_text(body))))
            return FakeReply(text="noted " + " ".join(tokens), delay=rng.uniform(0.0, 0.3))
        text = new_user_text(body)
        tokens = sorted(set(TOKEN.findall(text)))
        counts["turn"] += 1
        if roll < 0.10:
            counts["500"] += 1
            return FakeReply(status=500)
        if roll < 0.14:
            counts["too slow"] += 1
            return FakeReply(text="too late " + " ".join(tokens), delay=LLM_TIMEOUT + 1.0)
        if "note" in text and tokens and not tool_ran(body):  # (one note a turn, as the tool journal has)
            counts["note"] += 1
            args = {"action": "append", "path": "memory/MEMORY.md", "content": f"- bot {tokens[0]}"}
            return FakeReply(tool_calls=[("files", args)], delay=rng.uniform(0.0, 0.3))
        if roll < 0.35 and tokens:
            counts["long"] += 1
            head = " ".join(tokens)
            lines = [f"{head} L{i:02d}/{LONG_LINES} " + "lorem ipsum dolor " * 8 for i in range(LONG_LINES)]
            return FakeReply(text="\n\n".join(lines), stall_after=2, stall=rng.uniform(0.0, 1.0))
        return FakeReply(text="echo: " + " ".join(tokens), stall_after=2, stall=rng.uniform(0.0, 0.8))

    return respond


async def write_messages(
    tg: TimedTelegram,
    rng: random.Random,
    sent: dict[str, int],
    news: Counter[int],
    stop: asyncio.Event,
) -> None:
    while not stop.is_set() and len(sent) < MAX_MESSAGES:
        chat = rng.choice(CHATS)
        if rng.random() < 0.05:
            news[chat] += 1
            update = tg.push_message("/new", chat_id=chat, user_id=42)
            print(f"/new {update['message']['message_id']} in {chat} at {time.monotonic():.2f}")
        else:
            token = f"tok{len(sent):05d}"
            sent[token] = chat
            verb = "please note" if rng.random() < 0.15 else "message"
            # Long enough that a few turns fill the small window and compaction runs.
            tg.push_message(f"{verb} {token} " + "blah " * rng.randrange(5, 60), chat_id=chat, user_id=42)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(rng.uniform(0.05, 0.25)):
                await stop.wait()


class Operator:
    """Adds numbered lines to MEMORY.md, by an editor's rename or a rewrite in place."""

    def __init__(self, path: Path, rng: random.Random) -> None:
        self.path, self.rng = path, rng
        self.lines: list[str] = []

    def edit(self) -> None:
        text = self.path.read_text() if self.path.exists() else "# Memory\n"
        line = f"- operator line {len(self.lines):04d}"
        self.lines.append(line)
        lines = text.splitlines()
        lines.insert(self.rng.randrange(len(lines) + 1), line)
        save(self.path, "\n".join(lines) + "\n", self.rng)


async def until_the_stop(service: Service, rng: random.Random, op: Operator) -> str:
    roll = rng.random()
    if roll < 0.3:  # start-up: recovery of what the last run left
        await asyncio.sleep(rng.uniform(0.2, 2.0))
        return "start-up"
    with contextlib.suppress(TimeoutError):
        await service.wait_log("telegram_started", timeout=30)
    if roll < 0.45:
        await asyncio.sleep(rng.uniform(0.0, 1.0))
        await asyncio.to_thread(op.edit)  # the operator saves while the bot runs
    await asyncio.sleep(rng.uniform(0.1, 2.0))
    return "serving"


@pytest.mark.parametrize("streaming", [False, True], ids=["sent-whole", "streamed"])
async def test_chaos_kills_and_stops_with_compaction_new_tools_long_answers_and_model_failures(
    tmp_path: Path, streaming: bool
) -> None:
    seed = int(os.environ.get("MEMBOT_SOAK_SEED") or random.SystemRandom().randrange(1, 10**6))
    users, rounds = random.Random(f"{seed}-users"), random.Random(f"{seed}-rounds")
    print(f"chaos soak seed {seed} (MEMBOT_SOAK_SEED={seed} replays it)")
    workspace = tmp_path / "ws"
    memory = workspace / "memory" / "MEMORY.md"
    memory.parent.mkdir(parents=True)
    memory.write_text("# Memory\n")
    models = tmp_path / "models.json"
    entry = {"id": MODEL, "provider": "openai", "max_input_tokens": WINDOW, "max_output_tokens": 512}
    models.write_text(json.dumps({"version": 1, "models": [entry]}))
    op = Operator(memory, random.Random(f"{seed}-operator"))
    sent: dict[str, int] = {}
    news: Counter[int] = Counter()
    counts: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    kills: list[float] = []
    starts: list[float] = []
    stderr: list[str] = []
    async with FakeLLMServer() as llm, TimedTelegram() as tg:
        llm.responder = chaotic_model(random.Random(f"{seed}-model"), counts)
        env = telegram_env(
            tg,
            MEMBOT_TELEGRAM__POLL_TIMEOUT="2",
            MEMBOT_MODELS_FILE=str(models),
            MEMBOT_LLM__MODEL=MODEL,
            MEMBOT_LLM__MAX_RETRIES="0",
            MEMBOT_LLM__TIMEOUT=str(LLM_TIMEOUT),
            MEMBOT_MEMORY__EMBEDDINGS="none",
            MEMBOT_MEMORY__MEMORY_WINDOW="8",
            MEMBOT_MEMORY__KEEP_RECENT="3",
            MEMBOT_DISPATCHER__MODEL_RETRY_FIRST="0.3",
            MEMBOT_DISPATCHER__MODEL_RETRY_MAX="1",
            MEMBOT_LIFECYCLE__GRACE_PERIOD="2",
            MEMBOT_TELEGRAM__STREAMING=str(streaming).lower(),
            MEMBOT_LLM__FIRST_BYTE_TIMEOUT=str(LLM_TIMEOUT),
            MEMBOT_LLM__IDLE_TIMEOUT="3",
        )
        stop = asyncio.Event()
        writer = asyncio.create_task(write_messages(tg, users, sent, news, stop))
        end = time.monotonic() + PHASE
        while len(starts) < CYCLES and time.monotonic() < end:
            starts.append(time.monotonic())
            async with membot_run(workspace, llm, ready=None, **env) as service:
                moment = await until_the_stop(service, rounds, op)
                if rounds.random() < 0.25:  # a graceful stop, now and then cut short by a kill
                    service.process.send_signal(signal.SIGTERM)
                    patience = rounds.choice([0.0, 0.5, 1.5, 10.0])
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(patience):
                            await service.process.wait()
                    if service.process.returncode is None:
                        kills.append(time.monotonic())
                        kinds[f"SIGTERM then SIGKILL ({moment})"] += 1
                    else:
                        kinds[f"SIGTERM ({moment})"] += 1
                else:
                    kills.append(time.monotonic())
                    kinds[f"SIGKILL ({moment})"] += 1
                await service.kill()
                stderr.append(service.stderr)
            if rounds.random() < 0.5:
                await asyncio.to_thread(op.edit)  # the operator saves while the bot is down
            await asyncio.sleep(rounds.uniform(0.0, 0.5))
        stop.set()
        await writer
        starts.append(time.monotonic())
        tokens = lambda: {t for m in tg.messages.values() for t in TOKEN.findall(m.text)}  # noqa: E731
        cleared = lambda: sum(m.text.startswith(CLEARED) for m in tg.messages.values())  # noqa: E731
        async with membot_run(workspace, llm, **env) as service:
            with contextlib.suppress(TimeoutError):
                await tg.wait_for(lambda: set(sent) <= tokens() and cleared() >= sum(news.values()), 60)
            service.process.send_signal(signal.SIGTERM)
            code, _ = await service.finish()
            stderr.append(service.stderr)
            assert code == 0, service.stderr[-3000:]
        messages = sorted(tg.messages.values(), key=lambda m: m.message_id)
        downs = [(k, min(s for s in starts if s > k)) for k in kills]  # down from a kill to the next start

        def at_the_edge(first_id: int) -> bool:
            at = tg.sent_at[first_id]
            return any(k - EDGE <= at <= back for k, back in downs)

        # Every answer's keys: (token, "L07") for a line of a long answer, (token, kind) otherwise.
        where: dict[tuple[str, str], list[int]] = defaultdict(list)
        long_total: dict[str, int] = {}
        for message in messages:
            keys: set[tuple[str, str]] = set()
            for match in KEY.finditer(message.text):
                for token in match.group(1).split():
                    keys.add((token, f"L{match.group(2)}"))
                    long_total[token] = int(match.group(3))
            rest = KEY.sub("", message.text)
            for token in TOKEN.findall(rest):
                keys.add((token, rest.split()[0] if rest.split() else "?"))
            for key in keys:
                where[key].append(message.message_id)
        answered = {token for token, _ in where}
        lost = sorted(t for t in sent if t not in answered)
        cut = sorted(
            t
            for t, n in long_total.items()
            if {k for tok, k in where if tok == t} != {f"L{i:02d}" for i in range(n)}
        )
        wrong_chat = sorted(
            {t for (t, _), ids in where.items() if any(tg.messages[i].chat_id != sent[t] for i in ids)}
        )
        edge, duplicated = [], []
        for key, ids in where.items():
            for again in ids[1:]:
                same = tg.messages[again].text == tg.messages[ids[0]].text
                (edge if same and at_the_edge(ids[0]) else duplicated).append((key, ids))
        replies: dict[int, list[int]] = defaultdict(list)
        for message in messages:
            if message.text.startswith(CLEARED):
                replies[message.chat_id].append(message.message_id)
        new_wrong = {}
        for chat in CHATS:
            got = replies.get(chat, [])
            extra = len(got) - news[chat]
            edges = sum(at_the_edge(i) for i in got)
            if extra < 0 or extra > edges:
                new_wrong[chat] = (news[chat], len(got))
    corrupt = await asyncio.to_thread(corrupt_files, workspace)
    for n, text in enumerate(stderr):  # for a look at a failed run (pytest keeps the last runs' tmp_path)
        await asyncio.to_thread((tmp_path / f"run-{n:02d}.log").write_text, text)
    sent_log = [
        f"{m.message_id} {m.chat_id} {tg.sent_at[m.message_id]:.2f} {m.text[:90]!r}" for m in messages
    ]
    await asyncio.to_thread((tmp_path / "sent.txt").write_text, "\n".join(sent_log))
    unreadable = [line for text in stderr for line in text.splitlines() if "_unreadable" in line]
    final = (await asyncio.to_thread(memory.read_text)).splitlines()
    missing_op = [line for line in op.lines if line not in final]
    bot_twice = sorted({line for line in final if line.startswith("- bot ") and final.count(line) > 1})
    summary = (
        f"chaos soak seed {seed}: {len(sent)} messages and {sum(news.values())} /new in {len(CHATS)} chats, "
        f"{len(starts) - 1} rounds {dict(kinds)}; model {dict(counts)}; {len(tg.messages)} bot messages "
        f"({sum(m.edits for m in messages)} edits of streamed previews); "
        f"lost {len(lost)}, cut {len(cut)}, duplicated {len(duplicated)}, resent at the kill edge {len(edge)}, "
        f"wrong chat {len(wrong_chat)}, /new replies wrong {new_wrong}, corrupt {corrupt}, "
        f"unreadable {len(unreadable)}, operator lines missing {missing_op}, bot lines twice {bot_twice}"
    )
    print(summary)
    assert len(kills) >= 3, summary
    assert not lost, f"{summary}\nlost: {lost}"
    assert not cut, f"{summary}\nlong answers missing lines: {cut}"
    assert not duplicated, f"{summary}\nduplicated: {duplicated[:10]}"
    others = [(m.chat_id, m.text[:100]) for m in messages if not TOKEN.search(m.text)]
    assert not wrong_chat and not new_wrong and not corrupt and not unreadable, f"{summary}\n{others}"
    assert not missing_op and not bot_twice, summary
