"""Recall and the pack: whole messages once, a budget filled by relevance above a floor, current facts
first, and a hard budget that holds for any input."""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bot.memory.extract import Utterance, extract
from bot.memory.item_store import ItemStore
from bot.memory.items import Reference
from bot.memory.pack import CONVERSATIONS, FACTS, assemble, estimate_tokens, price
from bot.memory.recall import Recaller
from bot.memory.recent import RecentNotes
from bot.memory.retrieval import Retriever
from bot.tokens import TokenCounter

NOW = datetime(2024, 5, 20, 12, 0, tzinfo=UTC)
UTCZ = ZoneInfo("UTC")


async def remember(store: ItemStore, said: list[tuple[str, str, float]]) -> None:
    """(role, text, days ago) messages, each its own message id, through the real extraction."""
    utterances = [
        Utterance(role, text, NOW - timedelta(days=days), Reference("cli:me", f"m{i}"))
        for i, (role, text, days) in enumerate(said)
    ]
    await store.add_many(extract(utterances))


async def setup(tmp_path: Path, said: list[tuple[str, str, float]]) -> tuple[ItemStore, Retriever, Recaller]:
    store = ItemStore(tmp_path / "items")
    await store.load()
    retriever = Retriever(store)
    await remember(store, said)
    await retriever.ready()
    return store, retriever, Recaller(store, estimate_tokens, max_message_tokens=300)


def pack_text(retriever: Retriever, recaller: Recaller, query: str, *, soft: int = 1800, hard: int = 3500,
              floor: float = 0.2) -> tuple[str, object]:  # fmt: skip
    memories, _ = recaller.gather(retriever.rank(query, NOW, tz=UTCZ))
    recall = recaller.select(
        memories, soft=soft, hard=hard, floor=floor, cost=lambda m: price(m, estimate_tokens, UTCZ)
    )
    pack = assemble(recall, hard=hard, count=estimate_tokens, tz=UTCZ, query=query)
    return pack.text, pack


async def test_a_message_is_shown_whole_and_once(tmp_path: Path) -> None:
    text = (
        "I'm allergic to peanuts, so be careful with recipes. I love Thai food though. "
        "Last week I cooked green curry with tofu and it was great."
    )
    _, retriever, recaller = await setup(tmp_path, [("user", text, 3)])
    shown, _ = pack_text(retriever, recaller, "Thai curry recipe with peanuts")
    # Its passage and its typed sentences (preference) are one memory: the message, whole, once.
    assert shown.count("allergic to peanuts") == 1
    assert text in shown
    assert "- user: " in shown and "#### 2024-05-17 (Fri)" in shown


async def test_a_long_message_is_retrievable_to_its_last_line(tmp_path: Path) -> None:
    log_lines = [f"2024-05-{i % 28 + 1:02d} worker-{i} INFO processed batch {i} ok" for i in range(940)]
    log_lines.append("FATAL: disk quota exceeded on volume zeta-archive-7")
    pasted = "Here is my log:\n" + "\n".join(log_lines)
    assert len(pasted) > 45_000
    store, retriever, recaller = await setup(tmp_path, [("user", pasted, 1)])
    shown, _ = pack_text(retriever, recaller, "why did the zeta-archive-7 volume fail? disk quota")
    assert "FATAL: disk quota exceeded on volume zeta-archive-7" in shown
    assert "[…]" in shown  # only the parts that matched (and their neighbours), not 45,000 characters
    assert estimate_tokens(shown) < 1000
    parts = store.index.passages(("cli:me", "m0"))
    assert "".join(p.content for p in parts).replace("\n", "") == pasted.replace("\n", "")


async def test_the_pack_fills_its_budget_by_relevance_and_stops_at_the_floor(tmp_path: Path) -> None:
    said = [
        ("user", f"My garden has {n} tomato plants and basil number {n} near the fence.", 10 + n)
        for n in range(40)
    ]
    said.append(("user", "The weather in Lisbon is sunny and the tomato market is busy.", 1))
    _, retriever, recaller = await setup(tmp_path, said)
    _, small = pack_text(retriever, recaller, "tomato plants basil garden fence", soft=300)
    diag = small.diagnostics.recall  # type: ignore[attr-defined]
    assert diag.stop == "budget" and diag.dropped_for_budget > 0
    assert 150 < small.diagnostics.tokens <= 3500  # type: ignore[attr-defined]
    _, large = pack_text(
        retriever, recaller, "tomato plants basil garden fence", soft=100_000, hard=100_000, floor=0.5
    )
    diag = large.diagnostics.recall  # type: ignore[attr-defined]
    assert diag.stop == "floor" and diag.below_floor >= 1  # the Lisbon line shares one word: filler
    assert len(large.memories) == 40  # type: ignore[attr-defined]


async def test_the_newest_statement_on_a_subject_is_current_and_brings_the_older_along(
    tmp_path: Path,
) -> None:
    said = [
        ("user", "I live in Berlin and I love the lakes.", 300),
        ("user", "I live in Paris now, we moved last month!", 20),
    ]
    _, retriever, recaller = await setup(tmp_path, said)
    shown, pack = pack_text(retriever, recaller, "Berlin lakes")  # names only the older statement
    assert "I live in Paris now" in shown, "the current fact comes along with the outdated one"
    current = shown.index("I live in Paris now")
    older = shown.index("previously (2023-07-25): I live in Berlin")
    assert current < older
    assert pack.diagnostics.recall.superseded == 1  # type: ignore[attr-defined]


async def test_a_message_that_says_more_than_the_newer_statement_is_not_out_of_date(tmp_path: Path) -> None:
    said = [
        ("user", "I live in Paris. I work as a nurse at the city hospital.", 20),
        ("user", "I moved from Paris to Berlin.", 2),
    ]
    _, retriever, recaller = await setup(tmp_path, said)
    shown, pack = pack_text(retriever, recaller, "Paris nurse city hospital")
    assert "previously" not in shown and pack.diagnostics.recall.superseded == 0  # type: ignore[attr-defined]
    assert "I live in Paris. I work as a nurse" in shown and "I moved from Paris to Berlin." in shown


async def test_what_is_my_job_finds_i_work_as_a_nurse(tmp_path: Path) -> None:
    said = [
        ("user", "I work as a nurse at St. Mary's.", 40),
        ("user", "Can you suggest a good book about gardening?", 2),
    ]
    _, retriever, recaller = await setup(tmp_path, said)
    shown, _ = pack_text(retriever, recaller, "What is my job?")
    assert "I work as a nurse at St. Mary's." in shown


texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=3000)


@settings(max_examples=40, deadline=None)
@given(
    contents=st.lists(texts, min_size=0, max_size=20), soft=st.integers(0, 2000), extra=st.integers(0, 2000)
)
async def test_pack_never_exceeds_the_hard_budget(contents: list[str], soft: int, extra: int) -> None:
    hard = soft + extra
    with tempfile.TemporaryDirectory() as tmp:
        store = ItemStore(Path(tmp) / "items")
        await store.load()
        retriever = Retriever(store)
        recaller = Recaller(store, estimate_tokens, max_message_tokens=300)
        await remember(store, [("user", f"zebra {c}", 1) for c in contents])
        await retriever.ready()
        memories, _ = recaller.gather(retriever.rank("zebra", NOW, tz=UTCZ))
        recall = recaller.select(
            memories, soft=soft, hard=hard, floor=0.0, cost=lambda m: price(m, estimate_tokens, UTCZ)
        )
        pack = assemble(recall, hard=hard, count=estimate_tokens, tz=UTCZ)
    assert estimate_tokens(pack.text) <= hard
    assert pack.diagnostics.tokens <= hard


@pytest.fixture(scope="module")
def tiktoken_counter() -> TokenCounter:
    return TokenCounter.offline(model="gpt-4.1-mini", provider="openai")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(contents=st.lists(texts, min_size=1, max_size=12), days=st.lists(st.integers(0, 40), min_size=12))
@example(contents=["0", "0/;"], days=[0, 1, *[0] * 10])  # two conversation lines, no fact (CI found it)
async def test_the_pack_is_never_counted_below_its_real_tokens(
    tiktoken_counter: TokenCounter, contents: list[str], days: list[int]
) -> None:
    """The pack's tokens are summed from its lines' counts (no tokenizer pass over the whole pack):
    never below what the model's tokenizer makes of the rendered text, and close to it."""
    count = tiktoken_counter
    with tempfile.TemporaryDirectory() as tmp:
        store = ItemStore(Path(tmp) / "items")
        await store.load()
        retriever = Retriever(store)
        recaller = Recaller(store, count, max_message_tokens=300)
        said = [
            ("user" if i % 2 == 0 else "assistant", f"zebra {c}", d)
            for i, (c, d) in enumerate(zip(contents, days, strict=False))
        ]
        await remember(store, said)
        await retriever.ready()
        memories, _ = recaller.gather(retriever.rank("zebra", NOW, tz=UTCZ))
        recall = recaller.select(
            memories, soft=3000, hard=4000, floor=0.0, cost=lambda m: price(m, count, UTCZ)
        )
        pack = assemble(recall, hard=4000, count=recaller.count, tz=UTCZ)
    real = count(pack.text)
    assert real <= pack.diagnostics.tokens <= 4000
    # A newline or two per line; and the count pays for both section headings whether or not both are
    # shown (hypothesis found a pack of two conversation lines, no fact, 13 tokens over: 48 / 61).
    headings = count(FACTS) + count(CONVERSATIONS)
    assert pack.diagnostics.tokens <= real + 2 * (len(pack.memories) + 4) + headings


async def test_the_best_memories_bring_the_turns_around_them(tmp_path: Path) -> None:
    minute = 1 / 1440
    said = [
        ("user", "We finally adopted the greyhound from the shelter.", 5),
        ("assistant", "Congratulations! They love a short sprint and a long nap.", 5 - minute),
        ("user", "His name is Bolt and he is four years old.", 5 - 2 * minute),
        ("user", "Unrelated: the plumber comes on Friday.", 1),
    ]
    _, retriever, recaller = await setup(tmp_path, said)
    shown, pack = pack_text(retriever, recaller, "greyhound adopted shelter")
    assert "They love a short sprint" in shown  # the reply to it, though it shares no word with the query
    assert pack.diagnostics.recall.expanded >= 1  # type: ignore[attr-defined]
    assert "plumber" not in shown


async def test_todays_notes_show_each_message_as_it_is_now(tmp_path: Path) -> None:
    """Notes are remembered per message between turns; a message whose items change is noted afresh."""
    store, _, recaller = await setup(tmp_path, [("user", "we fixed the boiler in the cellar", 0.01)])
    notes = RecentNotes(store, recaller, tz=UTCZ, chat_scope=False)

    def lines() -> list[str]:
        found = notes.said_between(NOW - timedelta(days=1), NOW, "cli:me", set())
        return [line for _, line in notes.fit(found, 200)]

    assert [line.split(": ", 1)[1] for line in lines()] == ["we fixed the boiler in the cellar"]
    assert lines() == lines()  # remembered: the same line
    (passage,) = store.index.passages(("cli:me", "m0"))
    await store.put(passage.with_changes(content="we fixed the boiler and the radiator", updated_at=NOW))
    assert [line.split(": ", 1)[1] for line in lines()] == ["we fixed the boiler and the radiator"]
