"""Trimming a request: what is left out, or cut in the middle, when a request would not fit the window.

The last resort of the context budget (bot/context_budget.py), which decides the room: the oldest
history goes first (a call and its results together) but never the turn's own messages, then the middle
of the longest messages is cut, each to a fair share. Only what is sent is cut, never the session itself;
what was cut is said in the text (:data:`CUT_NOTE`, :data:`CUT_MARKS`, :data:`IMAGE_NOTE`), never silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from bot.domain import Message, Role
from bot.tokens import IMAGE_TOKENS, TokenCounter

CUT_NOTE = "\n[… {cut} characters left out here: the message is longer than the model's window allows …]\n"
# What stands for a whole text when not even CUT_NOTE fits its share, the shortest when the first does
# not fit either: never an empty message, which the model took for a page or an answer with nothing in it.
CUT_MARKS = ("[… {cut} characters left out …]", "[…]")
IMAGE_NOTE = "[{count} image(s) left out here: too large for the model's window]"


def trim_messages(
    messages: list[Message], room: int, counter: TokenCounter, *, keep: int = 1
) -> list[Message]:
    """Oldest messages out first (a call and its results together) down to the newest ``keep``, then
    the longest of those cut in the middle to one common length, until the messages fit ``room`` raw
    tokens. Only if that cannot fit do older ones go too, down to the newest message and what goes
    with it (the call of a result).

    A turn's results that overflow the window (several long tool results at once) are so cut each to
    a fair share: left out oldest first, they took the question and the calls with them, and the model
    answered one orphaned result without knowing what was asked."""

    def total() -> int:
        return counter.messages_tokens(messages)

    def drop_oldest(down_to: int) -> None:
        while total() > room:
            unit = _first_unit(messages)
            if len(messages) - unit < max(1, down_to):
                return
            del messages[:unit]

    drop_oldest(keep)
    if total() > room:
        _cut_evenly(messages, room, counter)
    drop_oldest(1)
    while messages and total() > room:
        # The message with the most to cut (its text, its images), cut to what the others and its own
        # fixed part (its overhead, its tool calls) leave: given the room less the others alone, its
        # text stayed, and the request went out over the window by that fixed part.
        longest = max(range(len(messages)), key=lambda i: _cuttable(messages[i], counter))
        message = messages[longest]
        target = max(0, room - (total() - _cuttable(message, counter)))
        cut = cut_text(message.content, target, counter)
        if cut == message.content and not message.images:
            break  # nothing left to cut: the caller's room is below one message's overhead
        if message.images:  # said, not silently gone: a photo sent alone was an empty message
            note = IMAGE_NOTE.format(count=len(message.images))
            cut = f"{cut}\n{note}" if cut else note
        messages[longest] = dataclasses.replace(message, content=cut, images=(), token_estimate=0)
    return messages


def _cuttable(message: Message, counter: TokenCounter) -> int:
    """The tokens of ``message`` a cut can take away: its text and its images."""
    return counter.count_text(message.content) + IMAGE_TOKENS * len(message.images)


def _first_unit(messages: Sequence[Message]) -> int:
    """How many of the oldest messages go out together: a call and its results (a result without its
    call, or a call without its results, is a request the providers refuse), else one message."""
    first = 1 if messages[0].role is not Role.TOOL else 0  # (results the history kept without a call)
    if first and not messages[0].tool_calls:
        return 1
    while first < len(messages) and messages[first].role is Role.TOOL:
        first += 1
    return first


def _cut_evenly(messages: list[Message], room: int, counter: TokenCounter) -> None:
    """Cut every text longer than one common length (the longest that lets all fit ``room``) to it.

    A text cut below its first :data:`CUT_MARKS` is the shortest mark, which it costs whatever the
    length; when even those do not fit, they are kept and the caller leaves older messages out."""
    sizes = [counter.count_text(m.content) for m in messages]
    free = room - (counter.messages_tokens(messages) - sum(sizes))  # what the texts may use together
    if free <= 0:
        return
    marks = [counter.count_text(CUT_MARKS[0].format(cut=len(m.content))) for m in messages]
    shortest = counter.count_text(CUT_MARKS[-1])

    def used(level: int) -> int:  # (never less for a higher level: the search below relies on it)
        return sum(
            min(size, level if level >= mark else shortest) for size, mark in zip(sizes, marks, strict=True)
        )

    low, high = 0, max(sizes, default=0)
    while low < high:  # the longest common length that fits, by binary search
        level = (low + high + 1) // 2
        if used(level) <= free:
            low = level
        else:
            high = level - 1
    for i, size in enumerate(sizes):
        if size > low:
            cut = cut_text(messages[i].content, low, counter)
            messages[i] = dataclasses.replace(messages[i], content=cut, token_estimate=0)


def cut_text(text: str, tokens: int, counter: TokenCounter) -> str:
    """``text`` with its middle left out (and a note saying so), at most ``tokens`` raw tokens.

    When not even the note fits, one of :data:`CUT_MARKS` alone, the shortest over ``tokens`` if it must
    be (or ``text`` itself, if no longer than that): a message never silently becomes empty. The callers
    count what they get back, and leave older messages out when the marks do not fit."""
    size = counter.count_text(text)
    if size <= tokens:
        return text
    keep_lo, keep_hi = 0, len(text)
    best = ""
    while keep_lo <= keep_hi:  # the longest head+tail that fits, by binary search on characters kept
        keep = (keep_lo + keep_hi) // 2
        head, tail = text[: keep * 2 // 3], text[len(text) - keep // 3 :] if keep // 3 else ""
        candidate = head + CUT_NOTE.format(cut=len(text) - len(head) - len(tail)) + tail
        if counter.count_text(candidate) <= tokens:
            best, keep_lo = candidate, keep + 1
        else:
            keep_hi = keep - 1
    if best:
        return best
    marks = [mark.format(cut=len(text)) for mark in CUT_MARKS]
    fitting = next((mark for mark in marks if counter.count_text(mark) <= tokens), None)
    if fitting is not None:
        return fitting
    return marks[-1] if counter.count_text(marks[-1]) < size else text
