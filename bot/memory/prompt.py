"""The memory section of the system prompt, and the rules for what is left out.

Order under ``# Memory``: the current date and time (the turn's own, so the model can reason about
"last week"), a note on how to read the rest (:data:`READING_NOTE`), ``## Long-term Memory``
(MEMORY.md, capped with a visible notice), in chat scope
``## This Chat's Memory`` (the chat's own MEMORY.md, capped the same way), the retrieved pack
(``## Relevant Memory``), ``## Today's Notes``, then ``## Recent Context`` with one ``### YYYY-MM-DD``
block per day — shown only when the pack is empty. Empty sections are omitted, and so is the
``# Memory`` header when every section is empty.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date, datetime
from zoneinfo import ZoneInfo

TokenCounter = Callable[[str], int]


def cap_bytes(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` UTF-8 bytes at a line (or character) boundary."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text, False
    head = data[:limit].decode("utf-8", errors="ignore")
    cut = head.rfind("\n")
    return (head[:cut] if cut > limit // 2 else head), True


def now_line(now: datetime, tz: ZoneInfo) -> str:
    return f"Current date and time: {now.astimezone(tz):%Y-%m-%d %H:%M (%A)}, {tz.key}."


def long_term_section(
    text: str, limit: int, *, max_tokens: int | None = None, count: TokenCounter | None = None
) -> str:
    return _capped_section("Long-term Memory", "MEMORY.md", text, limit, max_tokens, count)


def chat_memory_section(
    text: str, limit: int, *, max_tokens: int | None = None, count: TokenCounter | None = None
) -> str:
    """The chat's own MEMORY.md (chat scope), under the same cap and notice as the shared one."""
    return _capped_section("This Chat's Memory", "This chat's MEMORY.md", text, limit, max_tokens, count)


def _capped_section(
    title: str, name: str, text: str, limit: int, max_tokens: int | None, count: TokenCounter | None
) -> str:
    """The file under ``limit`` bytes and, when given, ``max_tokens`` tokens (a small window)."""
    body = text.strip()
    if not body:
        return ""
    if max_tokens is not None and count is not None:
        # Bytes per token vary with the text: shrink the byte cap until the tokens fit too.
        while limit > 0 and count(cap_bytes(body, limit)[0]) > max(0, max_tokens - 60):
            limit = limit * 3 // 4
    shown, truncated = cap_bytes(body, limit)
    if not shown.strip():
        return f"## {title}\n[{name} is not shown: the model's context window has no room for it.]"
    section = f"## {title}\n{shown.rstrip()}"
    if truncated:
        size = len(body.encode("utf-8"))
        section += (
            f"\n\n[… {name} truncated: showing {len(shown.encode('utf-8'))} of {size} bytes; "
            "the rest is on disk and can be searched with the memory tool.]"
        )
    return section


def today_section(lines: Sequence[str]) -> str:
    return "## Today's Notes\n" + "\n".join(lines) if lines else ""


def recent_section(days: Sequence[tuple[date, Sequence[str]]]) -> str:
    blocks = [f"### {day.isoformat()}\n" + "\n".join(lines) for day, lines in days if lines]
    return "## Recent Context\n\n" + "\n\n".join(blocks) if blocks else ""


# How to read what follows, said once above it. Without it the model meets excerpts of old chats, its own
# earlier answers and a fact file with no word on what they are, and an old statement can read as current.
READING_NOTE = (
    "What you remember that may bear on this message: notes kept across conversations, and excerpts of "
    "past conversations under the dates they were said (your own earlier answers are marked as yours). Use "
    "what is relevant and ignore the rest; when memories disagree, the most recently dated one is true now."
)


def render_memory(
    *, long_term: str, pack: str, today: str, recent: str, chat: str = "", now: str = ""
) -> str:
    """Join the non-empty sections under ``# Memory`` after the date and :data:`READING_NOTE`; ``""``
    when there is nothing to say."""
    sections = [s for s in (long_term, chat, pack, today, "" if pack else recent) if s.strip()]
    if not sections:
        return now  # nothing remembered yet: the date alone, which the model always needs
    return "# Memory\n\n" + "\n\n".join([now, READING_NOTE, *sections] if now else [READING_NOTE, *sections])


def system_prompt(base: str, memory: str) -> str:
    return f"{base.rstrip()}\n\n{memory}" if memory else base.rstrip()
