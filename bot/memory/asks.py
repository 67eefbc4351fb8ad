"""What a query asks, beyond its words: about the assistant's own words, or for advice.

Ranking weighs who said what (bot/memory/retrieval.py): what the assistant said counts for less unless
the query is about it ("what did you recommend?"), and what the user only asked or planned counts for
less unless the query asks for suggestions, when what the user asked for says what they want.
"""

from __future__ import annotations

import re

_ABOUT_ASSISTANT = re.compile(
    r"\byou (?:said|told|mentioned|recommended|suggested|gave|wrote|listed|explained|described|shared|"
    r"provided|came up with|named|offered)\b|\byour (?:answer|suggestion|recommendation|advice|list|reply)\b"
    r"|\bremind me (?:what|of|about) (?:you|the)\b|\byou (?:created|made|drafted|composed)\b"
    r"|\bour (?:previous|last|earlier) (?:conversation|chat|discussion)",
    re.I,
)

_ADVICE = re.compile(
    r"\b(?:suggest|suggestions?|recommend|recommendations?|ideas?|tips|advice|should I|any good)\b", re.I
)


def asks_for_advice(query: str) -> bool:
    """Whether the query asks for suggestions or advice, rather than about what happened."""
    return bool(_ADVICE.search(query))


def asks_about_assistant(query: str) -> bool:
    """Whether the query is about what the assistant itself said ("what did you recommend?")."""
    return bool(_ABOUT_ASSISTANT.search(query))
