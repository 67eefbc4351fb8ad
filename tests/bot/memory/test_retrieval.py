"""Retrieval and the pack: tokenizer, ranking signals, per-layer top-k, budgets for any input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.memory.items import ItemType, Layer, MemoryItem, Reference
from bot.memory.pack import estimate_tokens, render_pack
from bot.memory.retrieval import Retriever, ScoredItem, diversify, tokenize, top_per_layer
from bot.memory.timehints import time_hint

NOW = datetime(2024, 5, 20, 12, 0, tzinfo=UTC)
UTCZ = ZoneInfo("UTC")


def make(
    content: str,
    *,
    days_ago: float = 0,
    layer: Layer = Layer.EPISODIC,
    type: ItemType = ItemType.EPISODE,
    ref: str = "",
    tags: tuple[str, ...] = ("user",),
    salience: float = 0.5,
) -> MemoryItem:
    at = NOW - timedelta(days=days_ago)
    return MemoryItem(
        layer=layer,
        type=type,
        title=content[:30],
        content=content,
        created_at=at,
        updated_at=at,
        last_accessed_at=at,
        tags=tags,
        salience=salience,
        references=(Reference("cli:me", ref or content[:12]),),
    )


def rank(items: list[MemoryItem], query: str) -> list[ScoredItem]:
    retriever = Retriever()
    return retriever.rank(retriever.refresh(items, 1), query, NOW, tz=UTCZ)


def test_tokenizer_lowercases_drops_stopwords_and_stems() -> None:
    assert tokenize("I've been Biking to the Bike-shop; 3 bikes!") == ["bik", "bik", "shop", "3", "bik"]


def test_tokenizer_meets_irregular_forms_through_their_lemma() -> None:
    assert tokenize("I bought it") == tokenize("buy it")
    assert tokenize("my older brother") == tokenize("old brother")
    assert tokenize("the children went") == tokenize("child go")


def test_tokenizer_keeps_other_scripts_and_pairs_cjk_characters() -> None:
    assert tokenize("Привет, мир! Café 42") == ["привет", "мир", "café", "42"]
    assert tokenize("我喜欢苹果") == ["我喜", "喜欢", "欢苹", "苹果"]
    assert tokenize("猫") == ["猫"]
    assert tokenize("snake_case") == tokenize("snake case")


def test_question_finds_the_statement_in_other_word_forms() -> None:
    items = [
        make("I bought a secondhand road bike last week"),
        make("we talked about buying a house someday in the mountains", tags=("assistant",)),
        make("the weather was nice"),
    ]
    assert rank(items, "What bike did I buy?")[0].item.content.startswith("I bought")
    assert rank([make("I'm 32 years old"), make("my mother is a nurse")], "How old am I?")[
        0
    ].item.content == ("I'm 32 years old")


def test_non_english_memory_is_searchable() -> None:
    items = [make("Моя сестра живёт в Порту"), make("рецепт пиццы"), make("我的猫叫小白")]
    assert rank(items, "где живёт сестра")[0].item.content == "Моя сестра живёт в Порту"
    assert rank(items, "我的猫叫什么")[0].item.content == "我的猫叫小白"


def test_relevant_item_ranks_first_and_irrelevant_are_left_out() -> None:
    items = [make("we talked about the weather"), make("my sister Ana lives in Porto"), make("pizza recipe")]
    ranked = rank(items, "Where does my sister live?")
    assert [s.item.content for s in ranked] == ["my sister Ana lives in Porto"]
    assert ranked[0].parts["lexical"] > 0


def test_recency_and_user_words_break_ties() -> None:
    old, new = make("moved to Berlin", days_ago=200, ref="a"), make("moved to Berlin!", days_ago=1, ref="b")
    assert rank([old, new], "moved Berlin")[0].item is new
    said_by_user = make("the garden has tomatoes", ref="u")
    said_by_bot = make("the garden has tomatoes.", ref="b", tags=("assistant",))
    assert rank([said_by_bot, said_by_user], "garden tomatoes")[0].item is said_by_user


def test_time_words_prefer_items_from_that_period() -> None:
    march = make("booked a flight with Delta", days_ago=75, ref="m")  # early March
    may = make("booked a flight with United", days_ago=2, ref="y")
    assert rank([march, may], "which flight did I book in March?")[0].item is march
    hint = time_hint("what did we do last week", NOW, UTCZ)
    assert hint is not None and hint(NOW - timedelta(days=3)) and not hint(NOW - timedelta(days=30))
    assert time_hint("what is my name", NOW, UTCZ) is None


def test_one_result_per_source_message_and_top_k_per_layer() -> None:
    items = [make(f"tea fact {i}", ref="same") for i in range(3)] + [
        make(f"tea rule {i}", layer=Layer.SEMANTIC, type=ItemType.PREFERENCE, ref=f"s{i}") for i in range(5)
    ]
    ranked = list(diversify(rank(items, "tea")))
    assert sum(1 for s in ranked if s.item.layer is Layer.EPISODIC) == 1
    chosen = top_per_layer(ranked, {Layer.SEMANTIC: 2, Layer.EPISODIC: 8, Layer.PROCEDURAL: 4})
    assert [s.item.layer for s in chosen].count(Layer.SEMANTIC) == 2


def test_index_follows_store_generation() -> None:
    retriever = Retriever()
    first = retriever.refresh([make("alpha")], 1)
    assert retriever.refresh([make("alpha")], 1) is first
    assert retriever.refresh([make("beta")], 2) is not first


texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=3000)


@settings(max_examples=60, deadline=None)
@given(
    contents=st.lists(texts, min_size=0, max_size=30), soft=st.integers(0, 2000), extra=st.integers(0, 2000)
)
def test_pack_never_exceeds_the_hard_budget(contents: list[str], soft: int, extra: int) -> None:
    hard = soft + extra
    ranked = [ScoredItem(make(c or "x", ref=str(i)), 1.0 - i / 100, 1.0) for i, c in enumerate(contents)]
    pack = render_pack(ranked, soft=soft, hard=hard, count=estimate_tokens, tz=UTCZ)
    assert estimate_tokens(pack.text) <= hard if pack.text else True
    assert pack.diagnostics.tokens <= hard
    assert len(pack.items) + pack.diagnostics.dropped_for_budget == len(ranked)


def test_pack_groups_by_layer_and_reports_diagnostics() -> None:
    ranked = [
        ScoredItem(make("chat about tea", ref="1"), 0.9, 1.0),
        ScoredItem(
            make("prefers green tea", layer=Layer.SEMANTIC, type=ItemType.PREFERENCE, ref="2"), 0.8, 0.9
        ),
    ]
    pack = render_pack(ranked, soft=1800, hard=3500, count=estimate_tokens, tz=UTCZ)
    assert pack.text.index("### Facts and preferences") < pack.text.index("### Episodes")
    assert "- [preference, 2024-05-20] prefers green tea" in pack.text
    assert "- [user, 2024-05-20] chat about tea" in pack.text
    assert [c["layer"] for c in pack.diagnostics.chosen] == ["episodic", "semantic"]
    assert 0 < pack.diagnostics.tokens <= 1800


def test_soft_budget_stops_adding_items() -> None:
    ranked = [ScoredItem(make("word " * 100, ref=str(i)), 1.0, 1.0) for i in range(10)]
    pack = render_pack(ranked, soft=300, hard=3500, count=estimate_tokens, tz=UTCZ)
    assert 1 <= len(pack.items) < 10 and pack.diagnostics.dropped_for_budget == 10 - len(pack.items)
