"""Heuristic extraction: what is typed (and what must not be), questions, subjects, whole passages."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from bot.memory.extract import (
    PASSAGE_CHARS,
    Utterance,
    extract,
    is_question,
    passages,
    subjects_in_query,
    subjects_of,
    typed_sentences,
)
from bot.memory.items import ItemType, Reference

NOW = datetime(2024, 5, 20, 12, 0, tzinfo=UTC)


def types(text: str) -> list[ItemType]:
    return [t for t, _, _ in typed_sentences(text)]


def test_misread_sentences_from_real_conversations_are_not_typed() -> None:
    # Each of these was mislabelled and then promoted to a durable fact.
    assert types("I'll never forget the day my youngest took her first steps.") == []
    assert types("Why does my script throw an error when I import pandas?") == []
    assert types("I love that you chose pottery for your kids!") == []
    assert types("I like how you explained it.") == []
    assert types("I remember that day well, it was raining.") == []
    assert types("Don't worry, I'll figure out the rest of the setup.") == []


def test_real_instructions_preferences_and_facts_are_typed() -> None:
    assert types("Never call me Bob, my name is Robert.") == [ItemType.CONSTRAINT]
    assert types("Always answer in French from now on.") == [ItemType.CONSTRAINT]
    assert types("Please remember that I am allergic to peanuts.") == [ItemType.FACT]
    assert types("I really love hiking in the Alps.") == [ItemType.PREFERENCE]
    assert types("I work as a nurse at the city hospital.") == [ItemType.FACT]
    assert types("The build failed with a segmentation fault after the upgrade.") == [ItemType.FAILURE]


def test_only_explicit_requests_and_instructions_promote_at_once() -> None:
    confidence = {
        t: c for t, c, _ in typed_sentences("I really love hiking. Please remember my cat is Miso.")
    }
    assert confidence[ItemType.PREFERENCE] < 0.75 <= confidence[ItemType.FACT]


def test_questions_are_told_from_statements() -> None:
    assert is_question("What creative project do Mel and her kids do together?")
    assert is_question("Can you recommend a good book? Also, any tips for sleeping better?")
    assert not is_question("I just moved to Denver. Can you recommend hiking trails?")
    assert not is_question("I'm planning a trip to Lisbon, could you help me with restaurants?")
    assert not is_question("Thanks, that was helpful.")


def test_a_question_is_stored_as_one_and_never_typed() -> None:
    items = extract(
        [Utterance("user", "Why do I always get an error when I run it?", NOW, Reference("cli:me", "q"))]
    )
    assert [(i.type, i.tags) for i in items] == [(ItemType.EPISODE, ("user", "question"))]


def test_the_assistant_is_never_typed() -> None:
    items = extract(
        [Utterance("assistant", "Remember that you are allergic to peanuts.", NOW, Reference("cli:me", "a"))]
    )
    assert [i.type for i in items] == [ItemType.EPISODE]


def test_subjects_name_what_holds_one_value() -> None:
    assert subjects_of("I live in Paris now") == ["residence"]
    assert subjects_of("My sister's name is Hanna") == ["name:sister"]
    assert subjects_of("I work as a nurse") == ["work"]
    assert subjects_in_query("What is my job?") == ["work"]
    assert subjects_in_query("What is my sister's name?") == ["name:sister"]
    assert subjects_in_query("Where do I live these days?") == ["residence"]
    assert subjects_in_query("What's the name of the restaurant you recommended?") == []


@given(st.text(min_size=0, max_size=20_000))
def test_passages_cover_the_whole_text_in_order(text: str) -> None:
    pieces = passages(text)
    assert all(len(p) <= PASSAGE_CHARS for p in pieces)
    assert "".join(pieces) == "".join(text.split()) or "".join("".join(pieces).split()) == "".join(
        text.split()
    )
