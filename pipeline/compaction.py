"""AutoCompactionSystem (order 18): make room in the context window before the model is asked.

The decision is the context budget's (bot/context_budget.py): when the estimated next prompt — the
last system prompt seen (or the planned reserve on a session's first turn) plus the history, which
already holds the new message — passes ``threshold`` of what the window leaves for prompts, the older
messages are compacted first. The provider's own verdict ("too long") reaches the same service
through the tool loop.
"""

from __future__ import annotations

from typing import Any

from bot.compaction import CompactionResult
from bot.context_budget import ContextBudget
from pipeline.base import Turn

DIAG_ESTIMATE = "prompt_estimate"  # turn.diagnostics: calibrated prompt estimate at the start of the turn


class AutoCompactionSystem:
    """Compacts a session whose next prompt would not fit comfortably (see the module doc)."""

    name = "auto_compaction"
    order = 18

    def __init__(self, budget: ContextBudget) -> None:
        self._budget = budget
        self.enabled = budget.enabled

    def should_process(self, turn: Turn) -> bool:
        return turn.reply is None

    async def process(self, turn: Turn) -> None:
        turn.diagnostics[DIAG_ESTIMATE] = await self._budget.estimate(turn.session)
        result = await self._budget.prepare(turn.session, keep_at_least=turn.own_count())
        if result is not None and result.performed:
            turn.diagnostics[DIAG_ESTIMATE] = await self._budget.estimate(turn.session)
            turn.diagnostics["compaction"] = diagnostics(result)


def diagnostics(result: CompactionResult) -> dict[str, Any]:
    return {
        "removed": result.removed,
        "kept": result.kept,
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
        "fallback": result.fallback,
    }
