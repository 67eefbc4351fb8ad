"""AutoCompactionSystem (order 18): make room in the context window before the model is asked.

Trigger: the estimated prompt (system prompt and memory from the previous turn, or a reserve on the
first; the session history, which already holds the new message) exceeds ``threshold ×
max_input_tokens`` of the active model. The provider's own verdict is the second trigger: the tool
loop calls :meth:`AutoCompactionSystem.on_overflow` when a request was refused as too long, and retries.
"""

from __future__ import annotations

from typing import Any

import structlog

from bot.compaction import CompactionResult, CompactionService
from bot.config import CompactionSettings
from bot.domain import Session
from pipeline.base import Turn

log = structlog.get_logger(__name__)

META_OVERHEAD = "prompt_overhead_tokens"  # session.metadata: basis tokens of the last system prompt
DIAG_ESTIMATE = "prompt_estimate"  # turn.diagnostics: calibrated prompt estimate at the start of the turn
DIAG_OVERFLOWS = "overflow_compactions"
AFTER_FRACTION = 0.5  # after compacting, aim to use at most this share of the trigger level


def prompt_overhead(turn: Turn) -> str:
    """The prompt text outside the history: the system prompt, and memory if it is separate."""
    if turn.memory_context and turn.memory_context not in turn.system_prompt:
        return f"{turn.system_prompt}\n\n{turn.memory_context}"
    return turn.system_prompt


class AutoCompactionSystem:
    """Compacts a session whose next prompt would not fit comfortably (see the module doc).

    ``window`` is the active model's ``max_input_tokens``; ``reserve_tokens`` stands for the system
    prompt and memory pack on a session's first turn, before their real size was seen.

    Wire :meth:`on_overflow` into the tool loop::

        auto = AutoCompactionSystem(service, settings.compaction, window=info.max_input_tokens,
                                    reserve_tokens=reserve)
        loop = ToolLoopSystem(llm, tools, settings.tools, on_overflow=auto.on_overflow,
                              max_overflow_retries=settings.compaction.max_overflow_retries)
    """

    name = "auto_compaction"
    order = 18

    def __init__(
        self,
        service: CompactionService,
        settings: CompactionSettings,
        *,
        window: int,
        reserve_tokens: int = 0,
    ) -> None:
        self._service = service
        self._counter = service.counter
        self._settings = settings
        self._window = window
        self._reserve = reserve_tokens
        self.enabled = settings.enabled

    @property
    def limit(self) -> int:
        """Prompt tokens above which a turn compacts first."""
        return int(self._settings.threshold * self._window)

    def should_process(self, turn: Turn) -> bool:
        return turn.reply is None

    def _overhead_raw(self, session: Session) -> int:
        seen = session.metadata.get(META_OVERHEAD)
        return int(seen) if isinstance(seen, int) and seen >= 0 else self._reserve

    async def estimate(self, session: Session) -> int:
        """Calibrated tokens of the next prompt (overhead + history)."""
        raw = await self._counter.count_history(session) + self._overhead_raw(session)
        return self._counter.scale(session, raw)

    async def process(self, turn: Turn) -> None:
        session = turn.session
        estimate = await self.estimate(session)
        turn.diagnostics[DIAG_ESTIMATE] = estimate
        if estimate <= self.limit:
            return
        log.info("compaction_triggered", estimated=estimate, limit=self.limit, window=self._window)
        result = await self._service.compact(session, keep_last=self._keep_for(session), trigger="threshold")
        if result.performed:
            turn.diagnostics[DIAG_ESTIMATE] = await self.estimate(session)
            turn.diagnostics["compaction"] = _diag(result)

    async def on_overflow(self, turn: Turn) -> bool:
        """The provider refused the prompt as too long: compact harder on every attempt.

        Returns whether room was made (the caller retries only then). The session's calibration
        ratio is raised as well, since our estimate evidently fell short. With compaction disabled
        (``compaction.enabled = false``) nothing is compacted and the error reaches the user.
        """
        if not self.enabled:
            return False
        session = turn.session
        attempt = int(turn.diagnostics.get(DIAG_OVERFLOWS, 0)) + 1
        turn.diagnostics[DIAG_OVERFLOWS] = attempt
        raw = await self._counter.count_history(session) + self._counter.count_text(prompt_overhead(turn))
        self._counter.note_overflow(session, raw, self._window)
        keep = max(1, self._keep_for(session) >> (attempt - 1))
        log.warning("compaction_on_overflow", attempt=attempt, keep_last=keep, estimated_raw=raw)
        result = await self._service.compact(session, keep_last=keep, trigger="overflow")
        if result.performed:
            turn.diagnostics["compaction"] = _diag(result)
        return result.performed

    def _keep_for(self, session: Session) -> int:
        """How many recent messages to keep: ``keep_last``, or fewer if they alone would not fit."""
        budget = int(self.limit * AFTER_FRACTION)
        budget -= self._counter.scale(session, self._overhead_raw(session))
        budget -= min(self._settings.summary_max_tokens, self.limit // 10)  # room for the summary
        used = kept = 0
        for message in reversed(session.messages):
            used += self._counter.scale(session, self._counter.message_tokens(message))
            if kept and used > budget:
                break
            kept += 1
            if kept >= self._settings.keep_last:
                break
        return max(1, kept)


def _diag(result: CompactionResult) -> dict[str, Any]:
    return {
        "removed": result.removed,
        "kept": result.kept,
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
        "fallback": result.fallback,
    }
