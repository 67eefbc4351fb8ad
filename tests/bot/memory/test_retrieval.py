"""Retrieval: tokenizer, the incremental BM25 index, ranking signals, who said it, determinism."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import simplemma

from bot.memory.conversations import READ, rank_conversations
from bot.memory.item_store import ItemStore
from bot.memory.items import ItemType, Layer, MemoryItem, Reference, ScoredItem
from bot.memory.lexical import LexicalIndex
from bot.memory.retrieval import Retriever, diversify
from bot.memory.timehints import periods, time_hint
from bot.memory.weights import Weights
from bot.memory.word_match import reciprocal_rank_fusion
from bot.memory.words import normalize_word, stem, tokenize
from tests.bot.memory.conftest import said_before

NOW = datetime(2024, 5, 20, 12, 0, tzinfo=UTC)
UTCZ = ZoneInfo("UTC")


def make(content: str, **fields: Any) -> MemoryItem:
    return said_before(NOW, content, **fields)


async def retriever_over(tmp_path: Path, items: list[MemoryItem]) -> tuple[ItemStore, Retriever]:
    store = ItemStore(tmp_path / "items")
    await store.load()
    retriever = Retriever(store)
    await store.add_many(items)
    await retriever.ready()
    return store, retriever


async def rank(tmp_path: Path, items: list[MemoryItem], query: str) -> list[ScoredItem]:
    _, retriever = await retriever_over(tmp_path, items)
    return retriever.rank(query, NOW, tz=UTCZ)


def test_tokenizer_lowercases_drops_stopwords_and_stems() -> None:
    assert tokenize("I've been Biking to the Bike-shop; 3 bikes!") == ["bik", "bik", "shop", "3", "bik"]


def test_tokenizer_meets_irregular_forms_through_their_lemma() -> None:
    assert tokenize("I bought it") == tokenize("buy it")
    assert tokenize("my older brother") == tokenize("old brother")
    assert tokenize("the children went") == tokenize("child go")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_lemma_dictionary_takes_little_memory() -> None:
    # simplemma's default backend unpacked the English dictionary into a 19 MiB dict for the bot's life.
    probe = (
        "from pathlib import Path\nfrom bot.allocator import release_free_memory\nfrom bot.memory import words\n"
        "def rss(): return int(Path('/proc/self/statm').read_text().split()[1])\n"
        "release_free_memory(); before = rss()\nwords.load_lemmas()\nrelease_free_memory()\n"
        "print((rss() - before) * 4096)\n"
    )
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=root)
    assert int(done.stdout.split()[-1]) < 8 * 2**20, done.stderr


def test_lemmas_are_those_of_the_full_dictionary() -> None:
    from simplemma.strategies.dictionaries import DEFAULT_DICTIONARY_FACTORY

    english = DEFAULT_DICTIONARY_FACTORY.get_dictionary("en")
    sample = [*islice(english, 0, None, 25), "bought", "older", "children", "Went", "xyzzies", "naïve"]
    for word in sample:
        assert normalize_word(word) == stem(simplemma.lemmatize(word, lang="en").lower()), word


def test_tokenizer_keeps_other_scripts_and_pairs_cjk_characters() -> None:
    assert tokenize("Привет, мир! Café 42") == ["привет", "мир", "café", "42"]
    assert tokenize("我喜欢苹果") == ["我喜", "喜欢", "欢苹", "苹果"]
    assert tokenize("猫") == ["猫"]
    assert tokenize("snake_case") == tokenize("snake case")


def test_bm25_index_updates_in_place_and_scores_only_matching_documents() -> None:
    index = LexicalIndex()
    index.upsert("a", {"tea": 2, "green": 1})
    index.upsert("b", {"coffee": 1})
    assert set(index.scores(["tea"])) == {"a"}
    index.upsert("a", {"coffee": 3})  # a new version replaces the old terms
    assert index.scores(["tea"]) == {}
    assert set(index.scores(["coffee"])) == {"a", "b"}
    index.remove("b")
    assert set(index.scores(["coffee"])) == {"a"} and len(index) == 1
    assert all(score > 0 for score in index.scores(["coffee"]).values())  # idf stays positive
    # Folded into a numpy base, saved and loaded: the same scores, and writes go on on top of it.
    index.upsert("c", {"coffee": 1, "tea": 1})
    before = index.scores(["coffee", "tea"])
    merged = index.merged()
    assert merged.delta_size == 0 and merged.scores(["coffee", "tea"]) == pytest.approx(before)
    merged.remove("a")
    merged.upsert("d", {"tea": 4})
    assert set(merged.scores(["coffee", "tea"])) == {"c", "d"}
    full = merged.scores(["coffee", "tea"])
    best = max(full, key=full.__getitem__)
    assert merged.scores(["coffee", "tea"], limit=1) == {best: full[best]}  # of base and delta together


def test_bm25_scores_among_the_given_keys_take_the_limit_from_those_alone() -> None:
    index = LexicalIndex()
    for n in range(20):  # everyone else says it more often
        index.upsert(f"other-{n}", {"coffee": 5})
    index.upsert("mine-old", {"coffee": 1, "milk": 1})
    merged = index.merged()
    merged.upsert("mine-new", {"coffee": 1})  # in the delta
    merged.upsert("other-new", {"coffee": 9})
    assert "mine-old" not in merged.scores(["coffee"], limit=5)
    mine = {"mine-old", "mine-new", "mine-removed"}
    assert set(merged.scores(["coffee"], limit=5, only=mine)) == {"mine-old", "mine-new"}
    mine_scores = merged.scores(["coffee"], only=mine)
    mine_best = max(mine_scores, key=mine_scores.__getitem__)
    assert merged.scores(["coffee"], limit=1, only=mine) == {mine_best: mine_scores[mine_best]}
    assert merged.scores(["coffee"], only=set()) == {}


async def test_question_finds_the_statement_in_other_word_forms(tmp_path: Path) -> None:
    items = [
        make("I bought a secondhand road bike last week"),
        make("we talked about buying a house someday in the mountains", tags=("assistant",)),
        make("the weather was nice"),
    ]
    assert (await rank(tmp_path, items, "What bike did I buy?"))[0].item.content.startswith("I bought")
    ages = [make("I'm 32 years old"), make("my mother is a nurse")]
    assert (await rank(tmp_path / "2", ages, "How old am I?"))[0].item.content == "I'm 32 years old"


async def test_non_english_memory_is_searchable(tmp_path: Path) -> None:
    items = [make("Моя сестра живёт в Порту"), make("рецепт пиццы"), make("我的猫叫小白")]
    assert (await rank(tmp_path, items, "где живёт сестра"))[0].item.content == "Моя сестра живёт в Порту"
    assert (await rank(tmp_path, items, "我的猫叫什么"))[0].item.content == "我的猫叫小白"


async def test_relevant_item_ranks_first_and_irrelevant_are_left_out(tmp_path: Path) -> None:
    items = [make("we talked about the weather"), make("my sister Ana lives in Porto"), make("pizza recipe")]
    ranked = await rank(tmp_path, items, "Where does my sister live?")
    assert [s.item.content for s in ranked] == ["my sister Ana lives in Porto"]
    assert ranked[0].lexical > 0 and ranked[0].relevance > 0


async def test_recency_and_user_words_break_ties(tmp_path: Path) -> None:
    old, new = make("moved to Berlin", days_ago=200, ref="a"), make("moved to Berlin!", days_ago=1, ref="b")
    assert (await rank(tmp_path, [old, new], "moved Berlin"))[0].item.id == new.id
    # The same words said by the user and by the assistant: the user's rank first, although the
    # assistant's line is newer and more salient (everything but who said it favours the assistant).
    said_by_user = make("the garden has tomatoes", ref="u", days_ago=10)
    said_by_bot = make("the garden has tomatoes.", ref="b", tags=("assistant",), salience=0.9)
    ranked = await rank(tmp_path / "2", [said_by_bot, said_by_user], "garden tomatoes")
    assert [s.item.id for s in ranked] == [said_by_user.id, said_by_bot.id]
    assert ranked[0].lexical == ranked[1].lexical  # the words tie: only who said them differs
    assert ranked[1].relevance < ranked[0].relevance


async def test_a_ranking_follows_a_changed_item_it_ranked_before(tmp_path: Path) -> None:
    # What ranking reads of an item is remembered per version: a new version ranks by its own traits.
    user = make("the garden has tomatoes", ref="u", days_ago=10)
    other = make("the garden has tomatoes too", ref="o", days_ago=10)
    store, retriever = await retriever_over(tmp_path, [user, other])
    first = {s.item.id: s for s in retriever.rank("garden tomatoes", NOW, tz=UTCZ)}
    assert first[user.id].relevance == first[other.id].relevance
    await store.put(user.with_changes(tags=("assistant",), salience=0.9))
    again = {s.item.id: s for s in retriever.rank("garden tomatoes", NOW, tz=UTCZ)}
    assert again[user.id].relevance < first[user.id].relevance  # now the assistant's words
    assert again[other.id].relevance == first[other.id].relevance
    assert again[user.id].score - again[user.id].relevance * retriever.weights.lexical > (
        first[user.id].score - first[user.id].relevance * retriever.weights.lexical
    )  # and more salient


async def test_what_the_assistant_said_ranks_below_the_user_unless_asked_about(tmp_path: Path) -> None:
    # The model once misheard "Hanna" as "Anna": its own line must not outrank the user's words.
    user = make("My sister's name is Hanna.", ref="u", days_ago=1)
    bot = make("Your sister Anna sounds lovely, what a nice sister name!", ref="b", tags=("assistant",))
    ranked = await rank(tmp_path, [bot, user], "What is my sister's name?")
    assert ranked[0].item.id == user.id
    assert ranked[1].relevance < ranked[0].relevance
    # Asking about the assistant's own words lifts the penalty.
    recommended = make("I recommended the Kyoto ryokan Hiiragiya", ref="r", tags=("assistant",))
    mine = make("Kyoto ryokan prices are high", ref="m")
    asked = await rank(tmp_path / "2", [mine, recommended], "Which Kyoto ryokan did you recommend?")
    assert asked[0].item.id == recommended.id


async def test_a_question_ranks_below_a_statement(tmp_path: Path) -> None:
    # The same words asked and stated: the statement ranks first, although the question is newer and more
    # salient (everything but its being a question favours the question).
    # (under 30 characters each, so the titles make() cuts from them hold the same words too)
    asked = make("Do Mel and her kids paint?", ref="q", tags=("user", "question"), salience=0.9)
    said = make("Mel and her kids paint.", ref="s", days_ago=30)
    ranked = await rank(tmp_path, [asked, said], "What do Mel and her kids paint?")
    assert [s.item.id for s in ranked] == [said.id, asked.id]
    assert ranked[0].lexical == ranked[1].lexical  # the words tie: only the asking differs
    assert ranked[1].relevance < ranked[0].relevance


async def test_what_was_told_ranks_above_what_only_asked_or_planned_unless_advice_is_asked(
    tmp_path: Path,
) -> None:
    # The same words (and lemmas: "saw" is "see"); the plan is newer and more salient.
    plan = make("We'll see galleries on Sunday.", ref="p", tags=("user", "no-fact"), salience=0.9)
    told = make("We saw galleries on Sunday.", ref="t", days_ago=30)
    ranked = await rank(tmp_path / "1", [plan, told], "Which galleries did we see on Sunday?")
    assert [s.item.id for s in ranked] == [told.id, plan.id]
    assert ranked[0].lexical == ranked[1].lexical  # the words tie: only the telling differs
    # Asked for advice, what the user planned says what they want: no penalty, the newer one leads.
    ranked = await rank(tmp_path / "2", [plan, told], "Can you suggest galleries to see on Sunday?")
    assert [s.item.id for s in ranked] == [plan.id, told.id]
    assert ranked[0].relevance == ranked[1].relevance


async def test_a_question_naming_a_subject_finds_a_statement_sharing_no_word(tmp_path: Path) -> None:
    nurse = make("I work as a nurse", type=ItemType.FACT, tags=("user", "subject:work"), ref="n")
    items = [nurse, make("what is a good job interview outfit", ref="o", tags=("user", "question"))]
    ranked = await rank(tmp_path, items, "What is my job?")
    assert nurse.id in {s.item.id for s in ranked}
    assert ranked[0].item.id == nurse.id


async def test_time_words_prefer_items_from_that_period(tmp_path: Path) -> None:
    march = make("booked a flight with Delta", days_ago=75, ref="m")  # early March
    may = make("booked a flight with United", days_ago=2, ref="y")
    assert (await rank(tmp_path, [march, may], "which flight did I book in March?"))[0].item.id == march.id
    hint = time_hint("what did we do last week", NOW, UTCZ)
    assert hint is not None and hint(NOW - timedelta(days=3)) and not hint(NOW - timedelta(days=30))
    assert time_hint("what is my name", NOW, UTCZ) is None


def test_time_words_name_periods_relative_to_the_querys_own_date() -> None:
    now = datetime(2023, 5, 20, 12, tzinfo=UTC)

    def hint(query: str) -> Callable[[datetime], bool]:
        found = time_hint(query, now, UTCZ)
        assert found is not None, query
        return found

    def on(day: str) -> datetime:
        return datetime.fromisoformat(day).replace(tzinfo=UTC)

    two_weeks = hint("what did I buy two weeks ago?")  # one to three weeks back
    assert two_weeks(on("2023-05-06")) and two_weeks(on("2023-05-12"))
    assert not two_weeks(on("2023-05-18")) and not two_weeks(on("2023-04-20"))
    assert hint("a couple of months ago")(on("2023-03-20")) and not hint("3 days ago")(on("2023-05-10"))
    last_may = hint("where was I last May?")  # the most recent May before this one, not every May
    assert last_may(on("2022-05-15")) and not last_may(on("2023-05-02")) and not last_may(on("2021-05-15"))
    third = hint("what happened on March 3rd?")  # the day, one either side
    assert third(on("2023-03-03")) and third(on("2023-03-04")) and not third(on("2023-03-10"))
    assert hint("the 14th of February")(on("2023-02-14"))
    assert hint("my trip last year")(on("2022-08-01")) and not hint("my trip last year")(on("2023-01-05"))
    # 2023-05-20 is a Saturday.
    last_thursday = hint("what did I cook last Thursday?")
    assert last_thursday(on("2023-05-18T19:00")) and not last_thursday(on("2023-05-11T19:00"))
    assert not last_thursday(on("2023-05-19T19:00"))
    assert hint("what did I say last Saturday?")(on("2023-05-13")) and hint("on Saturday")(on("2023-05-20"))
    assert hint("the plumber came on Monday")(on("2023-05-15T08:00"))
    assert time_hint("what do I do on Mondays?", now, UTCZ) is None  # a habit, not a day
    assert time_hint("when was the Sunday mass?", now, UTCZ) is None  # a name, not a day
    assert time_hint("I may 2x the dose in 2023", now, UTCZ) is None
    assert time_hint("February 30th", now, UTCZ) is None  # no such day: no hint, no crash


def test_a_day_whose_last_hour_repeats_ends_after_the_second_one() -> None:
    # Chile turned its clocks back at midnight ending 2024-04-06: 23:00-23:59 that Saturday came twice.
    santiago = ZoneInfo("America/Santiago")
    saturday = time_hint("what did I say last Saturday?", datetime(2024, 4, 8, 15, tzinfo=UTC), santiago)
    assert saturday is not None
    late = datetime(2024, 4, 7, 3, 30, tzinfo=UTC)  # Saturday 23:30, the second time
    assert late.astimezone(santiago).date() == date(2024, 4, 6)
    assert saturday(late) and not saturday(datetime(2024, 4, 7, 4, 0, tzinfo=UTC))  # Sunday 00:00


def test_a_leap_day_asked_about_in_a_later_year_is_the_last_one() -> None:
    # Asked in March 2025, "February 29th" is 2024's: 2025 has none.
    found = periods("what did we do on February 29th?", datetime(2025, 3, 10, 12, tzinfo=UTC), UTCZ)
    assert [(start.date(), end.date()) for start, end in found] == [(date(2024, 2, 28), date(2024, 3, 1))]


@pytest.mark.parametrize(
    ("query", "first", "last"),
    [
        ("what did I say on December 31, 2024?", date(2024, 12, 30), date(2025, 1, 1)),
        ("on Dec 31st, 2024", date(2024, 12, 30), date(2025, 1, 1)),
        ("on March 5 2024", date(2024, 3, 4), date(2024, 3, 6)),
        ("the 5th of March 2024", date(2024, 3, 4), date(2024, 3, 6)),
        ("what did we plan in March 2024?", date(2024, 3, 1), date(2024, 3, 31)),
        ("before March 2024", date(1970, 1, 1), date(2024, 2, 29)),
    ],
)
def test_a_date_named_with_its_year_is_that_years(query: str, first: date, last: date) -> None:
    # Asked on Jan 2 with memory spanning two years, the year said is the one meant: before, "December
    # 31, 2024" was the latest December 31st (2025's), "March 2024" every March, "March 5 2024" nothing.
    now = datetime(2026, 1, 2, 12, tzinfo=UTC)
    hint = time_hint(query, now, UTCZ)
    assert hint is not None and not hint.months
    assert [(start.date(), end.date()) for start, end in hint.spans] == [(first, last)]
    assert not hint(datetime(2025, 3, 5, 12, tzinfo=UTC)) and not hint(datetime(2025, 12, 31, 12, tzinfo=UTC))


async def test_one_result_per_source_message(tmp_path: Path) -> None:
    items = [make(f"tea fact {i}", ref="same") for i in range(3)] + [make("tea elsewhere", ref="other")]
    ranked = list(diversify(await rank(tmp_path, items, "tea")))
    assert len(ranked) == 2


async def test_index_follows_every_write_and_the_same_memory_ranks_the_same_after_a_restart(
    tmp_path: Path,
) -> None:
    store, retriever = await retriever_over(tmp_path, [make("alpha tea", ref="1")])
    assert [s.item.content for s in retriever.rank("tea", NOW)] == ["alpha tea"]
    added = await store.add(make("beta tea", ref="2"))
    assert {s.item.content for s in retriever.rank("tea", NOW)} == {"alpha tea", "beta tea"}
    await store.delete(added.id, NOW)
    assert [s.item.content for s in retriever.rank("tea", NOW)] == ["alpha tea"]
    # Equal scores are ordered by age and id, never by load order: a restart gives the same ranking.
    twins = [make("green tea", ref=f"t{i}") for i in range(4)]
    await store.add_many(twins)
    before = [s.item.id for s in retriever.rank("green tea", NOW)]
    reloaded = ItemStore(tmp_path / "items")
    again = Retriever(reloaded)
    await reloaded.load()
    await again.ready()
    assert [s.item.id for s in again.rank("green tea", NOW)] == before


async def test_the_same_memory_ranks_the_same_whatever_ids_its_items_got(tmp_path: Path) -> None:
    """Item ids are random: two memories of one conversation differ in them alone. A tie in the first
    hop was broken by id, so the second hop followed one lunch or the other, and the bench's figures
    moved between runs of the same code."""
    said = [
        make("Lunch with Maria at the harbour.", ref="m1"),
        make("Lunch with Tomas at the bakery.", ref="m2"),
        make("The harbour ferry was late again.", ref="m3", days_ago=3),
        make("The bakery sells rye bread now.", ref="m4", days_ago=3),
    ]
    orders = []
    for run, ids in enumerate((["a", "b", "c", "d"], ["b", "a", "d", "c"])):
        store = ItemStore(tmp_path / f"items{run}")
        await store.load()
        retriever = Retriever(store, Weights(hop_docs=1))
        await store.add_many([dataclasses.replace(item, id=i) for item, i in zip(said, ids, strict=True)])
        await retriever.ready()
        orders.append([s.item.content for s in retriever.rank("who was at lunch?", NOW, tz=UTCZ)])
    assert orders[0] == orders[1]
    assert len(orders[0]) == 3  # the two lunches, and what the second hop found around one of them


async def test_a_promoted_item_and_its_origin_are_one_memory(tmp_path: Path) -> None:
    store, retriever = await retriever_over(
        tmp_path, [make("I prefer green tea", type=ItemType.PREFERENCE, ref="p")]
    )
    await store.promote(NOW, threshold=0.5 - 0.1)  # confidence 0.5 is enough here
    ranked = retriever.rank("green tea", NOW)
    assert [s.item.layer for s in ranked] == [Layer.SEMANTIC]  # the original no longer competes
    reloaded = ItemStore(tmp_path / "items")
    again = Retriever(reloaded)
    await reloaded.load()
    await again.ready()
    assert [(s.item.id, s.item.layer) for s in again.rank("green tea", NOW)] == [
        (s.item.id, s.item.layer) for s in ranked
    ]


def test_reciprocal_rank_fusion_adds_each_lists_rank_share() -> None:
    first = {"a": 9.0, "b": 3.0, "c": 1.0}
    second = {"c": 0.9, "d": 0.2}
    fused = reciprocal_rank_fusion(first, second, k=10, weight=0.5)
    assert fused == pytest.approx({"a": 1 / 11, "b": 1 / 12, "c": 1 / 13 + 0.5 / 11, "d": 0.5 / 12})
    # Only ranks count: the same orders at other scales fuse alike.
    scaled = reciprocal_rank_fusion({k: v * 100 for k, v in first.items()}, second, k=10, weight=0.5)
    assert scaled == fused


async def test_the_second_hop_can_fuse_by_reciprocal_rank(tmp_path: Path) -> None:
    # "Lisbon" is asked; the trip's other message names no Lisbon but shares the trip's words.
    items = [
        make("Our Lisbon trip: we took the tram 28 to Alfama", ref="a"),
        make("The tram 28 to Alfama was packed, we walked back", ref="b"),
        make("Buy milk and eggs", ref="c"),
    ]
    _, retriever = await retriever_over(tmp_path, items)
    now = NOW + timedelta(days=1)
    summed = retriever.match_words("What did we do in Lisbon?", now).scores
    retriever.weights = dataclasses.replace(retriever.weights, hop_fusion_k=20)
    fused = retriever.match_words("What did we do in Lisbon?", now).scores
    assert set(fused) == set(summed) and items[1].id in fused  # found by the hop either way
    assert fused[items[0].id] == pytest.approx(1 / 21 + 0.3 / 21)  # first in both hops
    assert fused[items[1].id] == pytest.approx(0.3 / 22)  # second hop only, its second best


async def test_a_conversation_about_the_query_lifts_its_turns_when_weighed(tmp_path: Path) -> None:
    """Sessions as units (``Weights.conversation``, off by default): a turn gains from how much its
    conversation is about the query."""
    planning = said_in(make("kayak trip kayak trip planning", ref="a1", days_ago=5), "cli:a")
    aside = said_in(make("kayak paddled slowly", ref="a2", days_ago=5), "cli:a")
    elsewhere = said_in(make("kayak rental prices", ref="b1"), "cli:b")
    _, retriever = await retriever_over(tmp_path, [planning, aside, elsewhere])
    retriever.weights = dataclasses.replace(retriever.weights, session_rank=0.0)  # the blend alone
    now = NOW + timedelta(days=1)

    def order() -> list[str]:
        ranked = retriever.rank("kayak trip", now)
        return [s.item.id for s in ranked if s.item.id != planning.id]

    assert order() == [elsewhere.id, aside.id]  # the same words: the newer first
    retriever.weights = dataclasses.replace(retriever.weights, conversation=0.5)
    assert order() == [aside.id, elsewhere.id]  # its conversation is the one about the kayak trip


def said_in(item: MemoryItem, session: str, conversation: str = "") -> MemoryItem:
    """``item`` as said in chat ``session`` (and conversation ``conversation`` of it, when given)."""
    ref = Reference(session, item.references[0].message_id, conversation=conversation)
    return dataclasses.replace(item, references=(ref,))


def test_conversations_rank_as_units_by_their_best_turns_each_message_once() -> None:
    a_best = said_in(make("a1", ref="a1"), "cli:a")
    a_sentence = said_in(make("a1, one sentence", ref="a1"), "cli:a")  # the same message
    a_next = said_in(make("a2", ref="a2"), "cli:a")
    b_best = said_in(make("b1", ref="b1"), "cli:b")
    b_next = said_in(make("b2", ref="b2"), "cli:b")
    c_only = said_in(make("c1", ref="c1"), "cli:c", conversation="cli:c#2")
    gone = said_in(make("d1", ref="d1"), "cli:d")
    items = [a_best, a_sentence, a_next, b_best, b_next, c_only, gone]
    relevance = [0.8, 0.8, 0.2, 0.7, 0.6, 0.75, 0.0]
    # Best turn alone: c (0.75) before b (0.7); a's message counts once, not 0.8 + 0.8 / 2.
    assert rank_conversations(items, relevance, turns=1) == ["cli:a", "cli:c#2", "cli:b"]
    # The next turns count half as much as the one before: b 0.7 + 0.3 = 1.0, a 0.8 + 0.1, c 0.75.
    assert rank_conversations(items, relevance, turns=3) == ["cli:b", "cli:a", "cli:c#2"]


def test_conversations_are_ranked_by_the_most_relevant_candidates_only() -> None:
    """A conversation none of whose turns is among the READ most relevant is not among the best, however
    many lesser turns it has: reading hundreds of candidates per query for it cost ~0.1 ms."""
    singles = [said_in(make(f"s{n}", ref=f"s{n}"), f"cli:s{n}") for n in range(READ)]
    lesser = [said_in(make(f"x{n}", ref=f"x{n}"), "cli:x") for n in range(3)]
    relevance = [0.6] * READ + [0.5] * 3  # x: 0.5 + 0.25 + 0.125 = 0.875 > 0.6, were it read
    ranked = rank_conversations([*singles, *lesser], relevance, turns=3)
    assert "cli:x" not in ranked and len(ranked) == READ


async def test_the_best_conversations_lift_their_turns_in_a_second_stage(tmp_path: Path) -> None:
    """Sessions as units, in two stages (``Weights.session_rank``): conversations ranked by their turns'
    relevance, then each turn of the best ones lifted by its conversation's rank. Turns keep their order
    within a conversation, and those of the other conversations keep their score."""
    planning = said_in(make("kayak trip kayak trip planning", ref="a1", days_ago=5), "cli:a")
    aside = said_in(make("kayak paddled slowly", ref="a2", days_ago=5), "cli:a")
    elsewhere = said_in(make("kayak rental prices", ref="b1"), "cli:b")
    _, retriever = await retriever_over(tmp_path, [planning, aside, elsewhere])
    now = NOW + timedelta(days=1)
    retriever.weights = dataclasses.replace(retriever.weights, session_rank=0.0)

    def ranked() -> dict[str, float]:
        return {s.item.id: s.score for s in retriever.rank("kayak trip", now)}

    alone = ranked()
    assert list(alone) == [planning.id, elsewhere.id, aside.id]  # the same words: the newer first
    retriever.weights = dataclasses.replace(retriever.weights, session_rank=0.05, session_top=1)
    staged = ranked()
    assert list(staged) == [planning.id, aside.id, elsewhere.id]  # said in the conversation on the trip
    assert staged[planning.id] - alone[planning.id] == pytest.approx(0.05)
    assert staged[aside.id] - alone[aside.id] == pytest.approx(0.05)  # every turn of it alike
    assert staged[elsewhere.id] == alone[elsewhere.id]  # not among the best: its own score
    # Among the best five (k 60), the second conversation gains 61 / 62 of the first's lift.
    retriever.weights = dataclasses.replace(retriever.weights, session_top=5, session_rank_k=60)
    assert ranked()[elsewhere.id] - alone[elsewhere.id] == pytest.approx(0.05 * 61 / 62)
