"""UsageSystem (order 90, last): account a turn's tokens and cost, and learn from them.

After the model calls of a turn (``turn.usage``, summed by the tool loop), this system runs, even
when the turn was stopped or timed out (then only step 1: the finished calls were paid for), and

1. adds the usage to the session's totals and today's ledger (:func:`bot.usage.record_usage`);
2. tells the context budget how big the system prompt was, so the next turn's compaction check can
   count it before ContextBuilding has run (bot/context_budget.py);
3. lets the budget calibrate the session's token ratio from a single-call turn, whose
   ``input_tokens`` is exactly the prompt we can reconstruct (system prompt + history before the reply);
4. counts the turn's new messages now, so their cached counts are saved with the session.
"""

from __future__ import annotations

from bot.context_budget import ContextBudget
from bot.domain import Role
from bot.usage import UsageLedger, record_usage
from pipeline.base import Turn


class UsageSystem:
    """Per-turn usage accounting and token calibration (see the module doc)."""

    name = "usage"
    order = 90
    enabled = True
    always = True  # a stopped or timed-out turn's finished model calls were paid for: count them

    def __init__(self, budget: ContextBudget, ledger: UsageLedger | None) -> None:
        self._budget = budget
        self._ledger = ledger

    def should_process(self, turn: Turn) -> bool:
        return True

    async def process(self, turn: Turn) -> None:
        session = turn.session
        await record_usage(session, turn.usage, self._ledger)
        if turn.stopped:
            return  # a cut-short turn's prompt and reply don't match: no calibration from it
        self._budget.counter.history_tokens(session)  # caches the new messages' counts before the save
        if not turn.system_prompt:
            return  # nothing was sent (the model was never asked)
        # (an estimate, bot/llm/estimates.py, is our own count: nothing to learn from it)
        single = turn.usage.calls == 1 and turn.usage.input_tokens > 0 and not turn.usage.estimated_calls
        self._budget.observe(
            session,
            turn.system_prompt,
            actual_input_tokens=turn.usage.input_tokens if single else None,
            replies=[m for m in turn.new_messages if m.role is Role.ASSISTANT],
        )
