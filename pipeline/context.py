"""ContextBuildingSystem (order 20): the system prompt for this turn, with what memory knows.

It reads, it never writes the session: the dispatcher has already put the user's message into
``turn.session.messages`` (the history the model sees), and the tool loop adds the answer.
"""

from __future__ import annotations

from bot.memory.prompt import system_prompt
from bot.memory.service import MemoryService
from pipeline.base import Turn


class ContextBuildingSystem:
    """Sets ``turn.system_prompt`` = base prompt + ``# Memory`` (see bot/memory/prompt.py for the order).

    Without a memory service (memory disabled) the base prompt is used as is.
    """

    name = "context"
    order = 20
    enabled = True

    def __init__(self, memory: MemoryService | None, base_prompt: str) -> None:
        self._memory = memory
        self._base = base_prompt

    def should_process(self, turn: Turn) -> bool:
        return turn.reply is None

    async def process(self, turn: Turn) -> None:
        turn.system_prompt = system_prompt(self._base, "")
        if self._memory is None:
            return
        context = await self._memory.context(turn.user_text, session_id=turn.session.id)
        turn.memory_context = context.text
        turn.system_prompt = system_prompt(self._base, context.text)
        turn.diagnostics["memory"] = context.diagnostics
