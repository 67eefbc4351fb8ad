"""Cheap heuristic extraction: every answered turn becomes episodic items, with typed facts picked out.

This is the baseline that always runs, with no model call. Each message is kept whole, as passages of
at most ``PASSAGE_CHARS`` that together cover all of it (a pasted 45,000-character log is retrievable to
its last line), each referencing the message and its position so recall can put the message back
together. Every item carries who said it; a user message that only asks (every sentence a question or
a request) is tagged ``question``, so retrieval ranks it below statements: what was asked is not what
was said. Sentences of the user's that state a preference, a fact, a decision, a constraint on the
assistant, a task, a failure or a fix become typed items that promotion can later move to the durable
layers; questions are never typed, and the assistant's words never are (the model may be wrong).

A user message of several sentences is also found by each statement in it: people mention what matters
in passing ("Can you recommend an art shop? By the way, I took my niece to the museum on the 8th"), and
scored as a whole the message is about its main topic, its length diluting the words of the aside.
Each statement sentence is an episode of its own (tagged ``sentence``), with the same weight as the
message; it brings the message up, and recall shows the message, not the sentence alone.

What the user *told* of their life answers "what did I …" better than what they asked for: a user
episode that states no event or fact of theirs (only a request, a plan, thanks: "Can you recommend a
tent?", "I'll check those out") is tagged ``no-fact``, and retrieval ranks it a little below the
messages that do ("I took my niece to the museum", "my tank has 10 tetras") unless the query asks for
advice, where what the user asked for says what they want. The tag marks the many that tell nothing,
so items written before it existed rank as they did.

Typed facts about a *subject* the user can hold only one value of at a time (where they live, their
job, their name, …) carry a ``subject:<key>`` tag: recall shows the newest statement on a subject as
current and older ones as "previously", and a question that names the subject ("what is my job?")
finds the statement even when it shares no word with it ("I work as a nurse").
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime

from bot.memory.items import SENTENCE_TAG, ItemType, Layer, MemoryItem, Reference, make_title

PASSAGE_CHARS = 900
SENTENCE_CHARS = 400
QUESTION_TAG = "question"
NO_FACT_TAG = "no-fact"
SUBJECT_PREFIX = "subject:"

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_BREAK = re.compile(r"\n\s*\n|\n|(?<=[.!?])\s+")  # where a passage may end: paragraph, line, sentence
_ASKS = re.compile(
    r"^(?:what|how|why|when|where|which|who|whom|whose|is|are|was|were|do|does|did|can|could|would|will|"
    r"should|shall|may|might|any|anything|tell me|give me|show me|list|suggest|recommend|explain|describe|"
    r"help me|what's|how's|where's|who's)\b",
    re.I,
)
_FIRST_PERSON = re.compile(r"^(?:i|i'm|im|i've|i'd|i'll|my|we|we're|we've|our|me)\b", re.I)
_OPENERS = re.compile(r"^(?:(?:so|and|but|also|ok(?:ay)?|well|hey|hi|oh|btw|by the way)[,!]?\s+)+", re.I)
# A first-person event ("I went", "we've moved", "I recently bought") or state ("I have two cats", "I work
# nights", "I'm a nurse", "my sister is 30"); "I'm looking for …", "I'm thinking of …" state nothing yet.
_ADVERB = r"(?:recently |just |finally |already |actually |also |even |once |first |still |only |really )?"
_PAST = (
    r"(?:\w+ed|went|saw|got|bought|took|made|had|did|met|ran|came|began|spent|gave|found|left|sold|won|"
    r"read|wrote|flew|drove|rode|been|caught|built|brought|chose|ate|drank|fell|felt|forgot|heard|kept|"
    r"knew|lost|paid|put|said|sent|set|sat|slept|stood|swam|taught|thought|told|threw|wore)"
)
_EVENT = re.compile(rf"\b(?:I|we)(?:'ve| have| had)? {_ADVERB}{_PAST}\b", re.I)
_STATE = re.compile(
    rf"\b(?:I|we) {_ADVERB}(?:have|own|work|live|am|use|keep|play|do|volunteer|usually|always|never|"
    r"'m (?!looking|thinking|planning|trying|wondering|going|interested|curious|considering|hoping|not sure|"
    r"so |glad|excited|happy))\b|\b(?:my|our) (?:[\w'-]+ ){0,2}(?:is|are|was|were|has|have)\b",
    re.I,
)
_ABOUT_YOU = r"(?!\s+(?:that|how|it when|the way|when)\s+you\b)(?!\s+(?:you|your)\b)"

_PATTERNS: tuple[tuple[ItemType, float, re.Pattern[str]], ...] = (
    # Explicit requests to remember: imperative only ("I remember that day" is not one).
    (ItemType.FACT, 0.9, re.compile(r"^(?:please\s+)?(?:remember|note|keep in mind|don'?t forget)\b", re.I)),
    # Instructions to the assistant: imperative sentences ("I'll never forget ..." is not one).
    (
        ItemType.CONSTRAINT,
        0.8,
        re.compile(
            r"^(?:please\s+)?(?:always|never|don'?t(?: ever)?|do not(?: ever)?|make sure (?:to|you)|"
            r"from now on|going forward|in (?:the )?future)\b"
            r"(?!,? (?:worry|get me wrong|mind|know|be sorry))",
            re.I,
        ),
    ),
    # The user's own likes: not "I love that you ..." (about the other person).
    (
        ItemType.PREFERENCE,
        0.7,
        re.compile(
            r"\bI (?:really |also |usually |generally |much |absolutely |don'?t |do not )?"
            rf"(?:like|love|prefer|enjoy|hate|dislike|can'?t stand){_ABOUT_YOU}\b|\bmy fav",
            re.I,
        ),
    ),
    (
        ItemType.DECISION,
        0.7,
        re.compile(
            r"\b(?:I|we)(?:'ve| have)? (?:decided|chose|chosen|picked|settled on|went with|will go with)\b",
            re.I,
        ),
    ),
    (
        ItemType.FACT,
        0.7,
        re.compile(
            r"\bmy (?:name|birthday|wife|husband|partner|son|daughter|kids?|dog|cat|job|boss|email|address|"
            r"phone|home ?town|age)\b|\bI(?: am|'m) (?:a|an) \w+|\bI (?:now |currently |still )?"
            r"(?:live|work|grew up|was born|moved|relocated)\b",
            re.I,
        ),
    ),
    (
        ItemType.TASK_STATE,
        0.6,
        re.compile(r"\b(?:todo|remind me|I need to|I have to|I'?m working on)\b", re.I),
    ),
    (
        ItemType.FIX,
        0.65,
        re.compile(r"\b(?:fixed (?:it|this) by|the fix (?:is|was)|solved (?:it|this) by)\b", re.I),
    ),
    (ItemType.FAILURE, 0.6, re.compile(r"\b(?:error|exception|traceback|failed|crash(?:es|ed)?)\b", re.I)),
)

# Subjects that hold one current value: (key, pattern over a statement). The key may take a group.
_SUBJECTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("name:{0}", re.compile(r"\bmy (\w+)'s name\b", re.I)),
    ("name", re.compile(r"\bmy name is\b|\b(?:please )?call me\b", re.I)),
    ("favorite:{0}", re.compile(r"\bmy fav(?:ou?rite)? (\w+)", re.I)),
    (
        "residence",
        re.compile(
            r"\bI (?:now |currently |still |just )?"
            r"(?:live|am living|'m living|moved|relocated|am based|'m based)\b"
            r"|\bmy (?:home ?town|home address|address)\b",
            re.I,
        ),
    ),
    (
        "work",
        re.compile(
            r"\bI (?:now |currently |still |just )?(?:work|am working|'m working|started working)\b"
            r"|\bmy (?:job|occupation|profession|employer)\b"
            r"|\bI (?:got|started|took|accepted) a (?:new )?job\b",
            re.I,
        ),
    ),
    ("age", re.compile(r"\bI(?: am|'m) \d{1,3}(?: years old)?\b|\bmy age\b", re.I)),
    ("birthday", re.compile(r"\bmy birthday\b|\bI was born\b", re.I)),
)
# How a question names a subject, so the statement is found without sharing a word with it.
_SUBJECT_QUESTIONS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("name:{0}", re.compile(r"\bmy (\w+)'s name\b|\bname of my (\w+)\b", re.I)),
    ("name", re.compile(r"\bmy name\b|\bwhat am I called\b", re.I)),
    ("favorite:{0}", re.compile(r"\bmy fav(?:ou?rite)? (\w+)", re.I)),
    (
        "residence",
        re.compile(
            r"\bwhere (?:do|did) I (?:live|move)|\bmy (?:home ?town|home|address|city)\b|\bwhere I live\b",
            re.I,
        ),
    ),
    (
        "work",
        re.compile(
            r"\bmy (?:job|work|occupation|profession|career|employer)\b|\bwhere do I work\b"
            r"|\bwhat do I do for (?:a )?living\b|\bwhat do I do\b",
            re.I,
        ),
    ),
    ("age", re.compile(r"\bmy age\b|\bhow old am I\b", re.I)),
    ("birthday", re.compile(r"\bmy birthday\b|\bwhen was I born\b", re.I)),
)


def subjects_in_query(query: str) -> list[str]:
    """The subjects (see ``subjects_of``) a question asks about: "what is my job?" -> ["work"]."""
    out: list[str] = []
    for key, pattern in _SUBJECT_QUESTIONS:
        for m in pattern.finditer(query):
            groups = [g.lower() for g in m.groups() if g]
            out.append(key.format(*groups) if "{0}" not in key or groups else key.split(":")[0])
    return list(dict.fromkeys(out))


@dataclass(frozen=True, slots=True)
class Utterance:
    """One message to extract from: who said it, what, when, and where it sits."""

    role: str  # "user" | "assistant"
    text: str
    at: datetime
    reference: Reference
    # In a group: the sender's name, which ``text`` starts with ("Alice: ..."), and their platform id.
    # Typed statements keep the name, and a subject is the speaker's own: Bob's "I live in Paris" does
    # not make Alice's "I live in Berlin" out of date.
    speaker: str = ""
    speaker_id: str = ""

    @property
    def said(self) -> str:
        """The words without the speaker's name."""
        return self.text.removeprefix(f"{self.speaker}: ") if self.speaker else self.text

    def by_speaker(self, sentence: str) -> str:
        return f"{self.speaker}: {sentence}" if self.speaker else sentence

    def subject_tag(self, subject: str) -> str:
        return SUBJECT_PREFIX + owned_subject(subject, self.speaker_id or self.speaker)


def owned_subject(subject: str, owner: str) -> str:
    """A subject as one speaker's (``home@42``) in a group; as it is without an owner."""
    return f"{subject}@{owner}" if owner else subject


def passages(text: str, limit: int = PASSAGE_CHARS) -> list[str]:
    """``text`` cut into pieces of at most ~``limit`` characters, at paragraph, line or sentence ends
    where possible; together they cover all of it, in order (nothing past some count is dropped)."""
    text = text.strip()
    if len(text) <= limit:
        return [text] if text else []
    pieces: list[str] = []
    start = 0
    while len(text) - start > limit:
        window = text[start : start + limit]
        breaks = [m for m in _BREAK.finditer(window) if m.start() > limit // 3]
        lines = [m for m in breaks if "\n" in m.group()]  # a line end keeps the layout when re-joined
        cut = (lines or breaks)[-1].end() if breaks else 0
        if cut == 0:  # one giant "sentence" (code, a list without stops): cut at a space, else anywhere
            space = window.rfind(" ", limit // 2)
            cut = space + 1 if space > 0 else limit
        piece = text[start : start + cut].strip()
        if piece:
            pieces.append(piece)
        start += cut
    tail = text[start:].strip()
    if tail:
        pieces.append(tail)
    return pieces


def sentences_of(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


def _bare(sentence: str) -> str:
    return _OPENERS.sub("", sentence.strip().lstrip("\"'*-•([ ").strip())


def is_question_sentence(sentence: str) -> bool:
    """A sentence that asks (a question or a request for help), rather than tells."""
    bare = _bare(sentence)
    if not bare or _FIRST_PERSON.match(bare):
        return False
    return bare.rstrip("\"')*").endswith("?") or bool(_ASKS.match(bare))


def tells_fact(text: str) -> bool:
    """Whether a text tells an event or a fact of the speaker's life, rather than only asking, planning
    or thanking (see the module doc)."""
    return bool(_EVENT.search(text) or _STATE.search(text))


def is_question(text: str) -> bool:
    """Whether a message only asks: every sentence a question or a request, none a statement."""
    found = sentences_of(text)
    return bool(found) and all(is_question_sentence(s) for s in found)


def subjects_of(sentence: str) -> list[str]:
    out: list[str] = []
    for key, pattern in _SUBJECTS:
        m = pattern.search(sentence)
        if m:
            out.append(key.format(*(g.lower() for g in m.groups())))
    return out


def typed_sentences(text: str) -> Iterable[tuple[ItemType, float, str]]:
    """Statements that match a pattern, with the type and confidence the pattern implies."""
    for sentence in sentences_of(text):
        if not 12 <= len(sentence) <= SENTENCE_CHARS or is_question_sentence(sentence):
            continue
        bare = _bare(sentence)
        for item_type, confidence, pattern in _PATTERNS:
            if pattern.search(bare):
                yield item_type, confidence, sentence
                break


def statements(text: str, *, skip: Collection[str] = ()) -> list[str]:
    """The statement sentences of a message of several sentences (none for a single sentence: the
    message itself is that), except those in ``skip``."""
    found = sentences_of(text)
    if len(found) < 2:
        return []
    return [
        s
        for s in dict.fromkeys(found)
        if 12 <= len(s) <= SENTENCE_CHARS and s not in skip and not is_question_sentence(s)
    ]


def extract(utterances: Iterable[Utterance], *, source: str = "heuristic") -> list[MemoryItem]:
    """Episodic items for a turn's messages: passages of each, plus typed statements of the user's."""
    items: list[MemoryItem] = []
    for u in utterances:
        user = u.role == "user"
        said = u.said
        asks = user and is_question(said)
        tags = (u.role, QUESTION_TAG) if asks else (u.role,)
        salience = (0.35 if asks else 0.5) if user else 0.35
        pieces = passages(u.text)
        for part, piece in enumerate(pieces):
            ref = u.reference if len(pieces) == 1 else _with_part(u.reference, part)
            told = tags if not user or tells_fact(piece) else (*tags, NO_FACT_TAG)
            items.append(
                _item(ItemType.EPISODE, piece, u, source, told, confidence=0.5, salience=salience, ref=ref)
            )
        if not user or asks:
            continue
        typed = list(typed_sentences(said))
        found_by = (u.role, SENTENCE_TAG)
        for sentence in statements(said, skip={sentence for _, _, sentence in typed}):
            items.append(
                _item(
                    ItemType.EPISODE,
                    u.by_speaker(sentence),
                    u,
                    source,
                    found_by if tells_fact(sentence) else (*found_by, NO_FACT_TAG),
                    confidence=0.5,
                    salience=0.5,
                    ref=u.reference,
                )
            )
        for item_type, confidence, sentence in typed:
            typed_tags = (u.role, *(u.subject_tag(s) for s in subjects_of(sentence)))
            items.append(
                _item(
                    item_type,
                    u.by_speaker(sentence),
                    u,
                    source,
                    typed_tags,
                    confidence=confidence,
                    salience=0.7,
                    ref=u.reference,
                )
            )
    return items


def _with_part(ref: Reference, part: int) -> Reference:
    return Reference(ref.session_id, ref.message_id, ref.turn, part, ref.conversation)


def _item(
    item_type: ItemType,
    content: str,
    u: Utterance,
    source: str,
    tags: tuple[str, ...],
    *,
    confidence: float,
    salience: float,
    ref: Reference,
) -> MemoryItem:
    return MemoryItem(
        layer=Layer.EPISODIC,
        type=item_type,
        title=make_title(content),
        content=content,
        tags=tags,
        source=source,
        confidence=confidence,
        salience=salience,
        created_at=u.at,
        updated_at=u.at,
        last_accessed_at=u.at,
        references=(ref,),
    )
