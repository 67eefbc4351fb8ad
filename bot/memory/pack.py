"""The memory pack: recalled memories rendered as markdown for the prompt, within a token budget.

Facts (written by the memory tool or consolidation) come first; then what was said in past
conversations, grouped by day in the order it was said, each line saying who said it — the model
must be able to tell the user's own words from its earlier answers, and a question from a statement —
and carrying older statements on the same subject as "previously". Every message is rendered whole
when recall chose it whole, so what reaches the model is what was said, not a clipped excerpt.

The rendered pack never exceeds the hard budget: each memory is priced with its own day heading (an
over-estimate), and if token counts still do not add up the lowest-ranked memory goes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from zoneinfo import ZoneInfo

from bot.memory.items import ScoredItem
from bot.memory.memories import Memory
from bot.memory.recall import Recall, RecallDiagnostics

TokenCounter = Callable[[str], int]
HEADER = "## Relevant Memory"
FACTS = "### Facts and preferences"
CONVERSATIONS = "### From past conversations"


def estimate_tokens(text: str) -> int:
    """A conservative token estimate (bytes / 3.5): over-counts a little, so budgets hold for real."""
    return (len(text.encode("utf-8")) * 2 + 6) // 7


@dataclass(slots=True)
class PackDiagnostics:
    """What recall chose and why it stopped: shown in logs (counts only) and /status."""

    query: str = ""
    recall: RecallDiagnostics = field(default_factory=RecallDiagnostics)
    memories: Sequence[Memory] = ()  # what was chosen, best first
    tokens: int = 0
    soft_budget: int = 0
    hard_budget: int = 0
    embeddings: bool = False
    ms: float = 0.0

    @property
    def candidates(self) -> int:
        return self.recall.candidates

    @property
    def dropped_for_budget(self) -> int:
        return self.recall.dropped_for_budget

    @property
    def chosen(self) -> list[dict[str, object]]:
        """The chosen memories as /status and the debug log show them: built when asked, not every turn
        (a pack holds up to ~100 memories)."""
        return [
            {
                "key": m.key[1] if m.key[0] == "item" else m.key[0],
                "role": m.role,
                "score": round(m.score, 4),
                "relevance": round(m.relevance, 4),
                "whole": m.whole,
                "ids": [h.item.id for h in m.hits[:4]],
            }
            for m in self.memories
        ]

    def to_dict(self) -> dict[str, object]:
        r = self.recall
        return {
            "query": self.query[:200],
            "candidates": r.candidates,
            "chosen": self.chosen,
            "dropped_for_budget": r.dropped_for_budget,
            "below_floor": r.below_floor,
            "skipped_shown": r.skipped_shown,
            "superseded": r.superseded,
            "expanded": r.expanded,
            "stop": r.stop,
            "tokens": self.tokens,
            "soft_budget": self.soft_budget,
            "hard_budget": self.hard_budget,
            "embeddings": self.embeddings,
            "ms": self.ms,
        }


@dataclass(slots=True)
class MemoryPack:
    text: str
    memories: list[Memory]
    diagnostics: PackDiagnostics

    @property
    def items(self) -> list[ScoredItem]:
        """Every item behind the pack's memories (their use is recorded for decay)."""
        return [hit for m in self.memories for hit in m.hits]


def _indent(text: str) -> str:
    return text.strip().replace("\n", "\n  ")


def speaker(memory: Memory) -> str:
    who = "user (asked)" if memory.question else "user"
    if memory.role == "assistant":
        who = "assistant (you)"
    return f"{who} [in another chat: {memory.elsewhere}]" if memory.elsewhere else who


def said_in(memory: Memory) -> str:
    """The chat (session id) a memory was said in; "" for a fact that names none."""
    if memory.key[0] != "item":
        return memory.key[0]
    refs = memory.hits[0].item.references
    return refs[0].session_id if refs else ""


def day_heading(memory: Memory, tz: ZoneInfo) -> str:
    return _day_heading(memory.when, tz)


@functools.lru_cache(maxsize=4096)
def _day_heading(when: datetime, tz: ZoneInfo) -> str:
    """Remembered: every candidate of every turn is priced with its heading, and strftime is slow."""
    return f"#### {when.astimezone(tz):%Y-%m-%d (%a)}"


def memory_line(memory: Memory, tz: ZoneInfo) -> str:
    """One memory as markdown: a fact with its kind and date, or a message with who said it."""
    if memory.role == "fact":
        item = memory.hits[0].item
        where = f", from another chat: {memory.elsewhere}" if memory.elsewhere else ""
        line = f"- [{item.type.value}, {memory.when.astimezone(tz):%Y-%m-%d}{where}] {_indent(memory.text)}"
    else:
        line = _said(speaker(memory), memory.text)
    for older in memory.previously:
        when = older.when.astimezone(tz).strftime("%Y-%m-%d")
        line += f"\n  - previously ({when}): {_indent(older.text)}"
    return line


@functools.lru_cache(maxsize=8192)
def _said(who: str, text: str) -> str:
    """Remembered: a turn prices every memory it looks at, then counts and renders the chosen ones,
    each time with this line, and the same messages come back turn after turn."""
    return f"- {who}: {_indent(text)}"


def price(memory: Memory, count: TokenCounter, tz: ZoneInfo) -> int:
    """Tokens a memory costs in the pack, its own day heading included (an over-estimate)."""
    heading = 0 if memory.role == "fact" else count(day_heading(memory, tz)) + 1
    return count(memory_line(memory, tz)) + 1 + heading


def overhead(count: TokenCounter) -> int:
    return count(HEADER) + count(FACTS) + count(CONVERSATIONS) + 6


def render(memories: Sequence[Memory], tz: ZoneInfo) -> str:
    if not memories:
        return ""
    facts = sorted((m for m in memories if m.role == "fact"), key=lambda m: (m.when, m.key))
    said = sorted((m for m in memories if m.role != "fact"), key=lambda m: (m.when, m.key))
    blocks = [HEADER]
    if facts:
        blocks.append(FACTS + "\n" + "\n".join(memory_line(m, tz) for m in facts))
    if said:
        lines: list[str] = [CONVERSATIONS]
        heading = ""
        for memory in said:
            day = day_heading(memory, tz)
            if day != heading:
                lines.append(day)
                heading = day
            lines.append(memory_line(memory, tz))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def rendered_tokens(memories: Sequence[Memory], count: TokenCounter, tz: ZoneInfo) -> int:
    """Tokens of ``render(memories)`` from the counts of its lines (each line, day heading and section
    once, plus the newline after it). Never below the text's own count: a tokenizer such as tiktoken
    starts a new token after a newline, so a text costs at most its lines plus their newlines; with
    ``count`` remembering lines (Recaller.count) this needs no tokenizer pass over the ~2,800-token pack
    every turn (2-3 % of the event loop's thread under load)."""
    if not memories:
        return 0
    said = [m for m in memories if m.role != "fact"]
    headings = {day_heading(m, tz) for m in said}
    lines = sum(count(memory_line(m, tz)) + 1 for m in memories)
    return overhead(count) + lines + sum(count(h) + 1 for h in headings)


def assemble(recall: Recall, *, hard: int, count: TokenCounter, tz: ZoneInfo, query: str = "") -> MemoryPack:
    """Render a recall; drop the lowest-ranked memories until it fits ``hard`` tokens.

    ``count`` should remember what it counted: the lines were priced when recall chose them."""
    memories = list(recall.memories)
    tokens = rendered_tokens(memories, count, tz)
    while memories and tokens > hard:
        memories.pop()  # recall keeps them best first
        recall.diagnostics.dropped_for_budget += 1
        tokens = rendered_tokens(memories, count, tz)
    text = render(memories, tz)
    diag = PackDiagnostics(query=query, recall=recall.diagnostics, hard_budget=hard)
    diag.recall.chosen = len(memories)
    diag.tokens = tokens
    diag.memories = memories
    return MemoryPack(text, memories, diag)
