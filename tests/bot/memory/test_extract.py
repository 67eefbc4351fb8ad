"""Heuristic extraction: what is typed (and what must not be), questions, subjects, whole passages."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from bot.memory.extract import (
    NO_FACT_TAG,
    PASSAGE_CHARS,
    Utterance,
    extract,
    is_question,
    passages,
    subjects_in_query,
    subjects_of,
    tells_fact,
    typed_sentences,
)
from bot.memory.items import SENTENCE_TAG, ItemType, Reference

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


def test_each_statement_of_a_longer_message_is_an_episode_it_is_found_by() -> None:
    text = (
        "Can you recommend an art supply store? By the way, I took my niece to the museum on 2/8. "
        "Great day. Where do I find cheap canvas?"
    )
    items = extract([Utterance("user", text, NOW, Reference("cli:me", "m"))])
    found_by = [i for i in items if SENTENCE_TAG in i.tags]
    assert [i.content for i in found_by] == ["By the way, I took my niece to the museum on 2/8."]  # not
    # the questions, nor "Great day." (too short to be found by)
    assert all(i.type is ItemType.EPISODE and i.references == (Reference("cli:me", "m"),) for i in found_by)
    passage = next(i for i in items if SENTENCE_TAG not in i.tags)
    assert passage.content == text and (passage.confidence, passage.salience) == (
        found_by[0].confidence,
        found_by[0].salience,
    )  # the sentence weighs what its message weighs: only its own words and meaning differ


def test_a_single_sentence_or_a_question_is_not_split_and_a_sentence_is_not_its_message() -> None:
    one = extract([Utterance("user", "I took my niece to the museum on 2/8.", NOW, Reference("cli:me", "a"))])
    assert [SENTENCE_TAG in i.tags for i in one] == [False]
    asks = extract([Utterance("user", "Where is it? How late is it open?", NOW, Reference("cli:me", "b"))])
    assert not any(SENTENCE_TAG in i.tags for i in asks)
    told = extract(
        [
            Utterance(
                "user", "Out we went! I took my niece to the museum on 2/8.", NOW, Reference("cli:me", "c")
            )
        ]
    )
    sentence = next(i for i in told if SENTENCE_TAG in i.tags and "niece" in i.content)
    # The same words as message "a": a different memory, so neither message ever shows the other's text.
    assert sentence.content == one[0].content and sentence.fingerprint != one[0].fingerprint


def test_what_tells_an_event_or_a_fact_is_told_from_requests_plans_and_thanks() -> None:
    for told in (
        "I took my niece to the museum on 2/8.",
        "We've finally moved to Denver.",
        "I recently bought a Tamiya Spitfire kit.",
        "I have two cats and a dog.",
        "I'm a nurse, so I work nights.",
        "My 20-gallon tank has 10 neon tetras.",
        "I usually ride on paved roads.",
    ):
        assert tells_fact(told), told
    for untold in (
        "Can you recommend some good brands?",
        "I'm looking for a new screen protector.",
        "I'm thinking of visiting some galleries this weekend.",
        "I'll definitely check those out, thanks!",
        "That's a great list.",
    ):
        assert not tells_fact(untold), untold


def test_user_episodes_that_tell_nothing_are_tagged_so_and_nothing_else_is() -> None:
    def tags(role: str, text: str) -> list[tuple[str, ...]]:
        return [i.tags for i in extract([Utterance(role, text, NOW, Reference("cli:me", text[:8]))])]

    assert tags("user", "I'll check those out, thanks!") == [("user", NO_FACT_TAG)]
    assert tags("user", "I took my niece to the museum.") == [("user",)]
    assert tags("assistant", "I'll check those out, thanks!") == [("assistant",)]  # the user's only
    assert tags("user", "Can you recommend a tent?") == [("user", "question", NO_FACT_TAG)]
    # A message that tells something is not tagged; of its sentences, only those that tell nothing are.
    both = tags("user", "I'll look at tents later, thanks for that. By the way, I went to Lisbon in May.")
    assert both == [("user",), ("user", SENTENCE_TAG, NO_FACT_TAG), ("user", SENTENCE_TAG)]
