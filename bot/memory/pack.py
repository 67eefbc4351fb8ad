"""The memory pack: retrieved items rendered as markdown within a token budget.

Items go in by rank until the soft budget is reached; one more may cross it if the hard budget still
holds, so a single long, highly relevant item is not dropped for being long. The rendered pack never
exceeds the hard budget, whatever the input: any one item is cut to fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

from bot.memory.items import Layer
from bot.memory.notes import fold
from bot.memory.retrieval import ScoredItem

TokenCounter = Callable[[str], int]
HEADER = "## Relevant Memory"
LAYER_TITLES = {
    Layer.SEMANTIC: "Facts and preferences",
    Layer.PROCEDURAL: "How-to",
    Layer.EPISODIC: "Episodes",
}
ITEM_CHARS = 700


def estimate_tokens(text: str) -> int:
    """A conservative token estimate (bytes / 3.5): over-counts a little, so budgets hold for real."""
    return (len(text.encode("utf-8")) * 2 + 6) // 7


@dataclass(slots=True)
class PackDiagnostics:
    """What retrieval chose and why: shown in logs and /status."""

    query: str = ""
    candidates: int = 0
    chosen: list[dict[str, object]] = field(default_factory=list)
    dropped_for_budget: int = 0
    tokens: int = 0
    soft_budget: int = 0
    hard_budget: int = 0
    embeddings: bool = False
    ms: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "query": self.query[:200],
            "candidates": self.candidates,
            "chosen": self.chosen,
            "dropped_for_budget": self.dropped_for_budget,
            "tokens": self.tokens,
            "soft_budget": self.soft_budget,
            "hard_budget": self.hard_budget,
            "embeddings": self.embeddings,
            "ms": self.ms,
        }


@dataclass(slots=True)
class MemoryPack:
    text: str
    items: list[ScoredItem]
    diagnostics: PackDiagnostics


def item_line(scored: ScoredItem, tz: ZoneInfo) -> str:
    item = scored.item
    day = item.created_at.astimezone(tz).strftime("%Y-%m-%d")
    who = f"{item.tags[0]}, " if item.layer is Layer.EPISODIC and item.tags else ""
    kind = "" if item.type.value == "episode" else f"{item.type.value}, "
    return f"- [{kind}{who}{day}] {fold(item.content, ITEM_CHARS)}"


def render_pack(
    ranked: Sequence[ScoredItem],
    *,
    soft: int,
    hard: int,
    count: TokenCounter,
    tz: ZoneInfo,
    diagnostics: PackDiagnostics | None = None,
) -> MemoryPack:
    """Render ``ranked`` (best first) grouped by layer, within the budgets."""
    diag = diagnostics or PackDiagnostics()
    diag.soft_budget, diag.hard_budget = soft, hard
    overhead = count(HEADER) + sum(count(f"\n\n### {t}\n") for t in LAYER_TITLES.values()) + 2
    used = overhead
    chosen: list[tuple[ScoredItem, str]] = []
    for scored in ranked:
        if used >= soft:
            diag.dropped_for_budget += 1
            continue
        line = item_line(scored, tz)
        cost = count(line) + 1
        if used + cost > hard:
            line = _cut(line, hard - used - 1, count)
            cost = count(line) + 1
            if not line or used + cost > hard:
                diag.dropped_for_budget += 1
                continue
        chosen.append((scored, line))
        used += cost
    text = _assemble(chosen)
    while chosen and count(text) > hard:  # token counts need not add up exactly; the hard cap must hold
        chosen.pop()
        diag.dropped_for_budget += 1
        text = _assemble(chosen)
    if not chosen:
        return MemoryPack("", [], diag)
    diag.tokens = count(text)
    diag.chosen = [
        {
            "id": s.item.id,
            "layer": s.item.layer.value,
            "type": s.item.type.value,
            "score": round(s.score, 4),
            "lexical": round(s.lexical, 4),
            "title": s.item.title,
        }
        for s, _ in chosen
    ]
    return MemoryPack(text, [s for s, _ in chosen], diag)


def _assemble(chosen: Sequence[tuple[ScoredItem, str]]) -> str:
    if not chosen:
        return ""
    blocks = [HEADER]
    for layer in (Layer.SEMANTIC, Layer.PROCEDURAL, Layer.EPISODIC):
        lines = [line for scored, line in chosen if scored.item.layer is layer]
        if lines:
            blocks.append(f"### {LAYER_TITLES[layer]}\n" + "\n".join(lines))
    return "\n\n".join(blocks)


def _cut(line: str, budget: int, count: TokenCounter) -> str:
    """The longest prefix of ``line`` (ending in …) that fits ``budget`` tokens, or ``""``."""
    if budget <= 4:
        return ""
    lo, hi = 0, len(line)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(line[:mid] + "…") <= budget:
            lo = mid
        else:
            hi = mid - 1
    return line[:lo] + "…" if lo > 20 else ""
