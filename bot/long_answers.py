"""The bound on an answer's length: what a chat gets of an answer that runs on and on.

A server that ignores ``max_tokens`` can stream up to the client's own limit (bot/llm/limits.py,
8 Mi characters), which a channel would send as hundreds of messages at about one a second, holding
the chat. An answer longer than :data:`MAX_ANSWER_CHARS` (about ten Telegram messages) is cut, at a
paragraph, line or word break near the bound, and ends with a plain note that says so.

The tool loop cuts the model's answer before it is stored, so the session (and memory) keep what the
chat was sent: the next turn's model reads where the chat's copy stopped (asked to go on, it goes on
from there), and a runaway answer, most often a model repeating itself, is not fed back to it on every
later turn, paid for each time and crowding the context window. The dispatcher bounds every reply
again before it is saved to be sent, whatever set it.

>>> bounded("short")
'short'
"""

from __future__ import annotations

import re

MAX_ANSWER_CHARS = 40_000
CUT_NOTE = "… (the answer was cut here: it was longer than {limit:,} characters)"

_BREAKS = ("\n\n", "\n", " ")
_SEARCH = 2_000  # how far back from the bound a break is looked for (at most a tenth of it)
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.MULTILINE)


def bounded(text: str, limit: int = MAX_ANSWER_CHARS) -> str:
    """``text`` as it is when it has at most ``limit`` characters; else its start, cut at a break,
    with a code block left open closed, and :data:`CUT_NOTE`: at most ``limit`` characters in all, so
    a bounded text is bounded again unchanged."""
    if len(text) <= limit:
        return text
    note = CUT_NOTE.format(limit=limit)
    room = limit - len(note) - len("\n\n") - len("\n```")
    head = text[:room]
    floor = room - min(_SEARCH, room // 10)
    cut = next((at for sep in _BREAKS if (at := head.rfind(sep, floor)) > 0), room)
    head = head[:cut].rstrip()
    fences = _FENCE.findall(head)
    if len(fences) % 2:  # a code block is open: close it, or the note would show as code
        head += "\n" + fences[-1]
    return f"{head}\n\n{note}"
