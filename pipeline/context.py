"""ContextBuildingSystem (order 20): the system prompt for this turn, with what memory knows.

It reads, it never writes the session: the dispatcher has already put the user's message into
``turn.session.messages`` (the history the model sees), and the tool loop adds the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import structlog

from bot.context_budget import ContextBudget
from bot.domain import InboundMessage
from bot.memory import MemoryService, system_prompt
from pipeline.base import Turn

log = structlog.get_logger(__name__)
# Said to the model in a group, where every message starts with its sender's name (bot/intake.py).
GROUP_NOTE = (
    "This is a group chat: several people write here, and each of their messages starts with the "
    "sender's name. A memory marked as from another chat was said there, by whoever writes in it: not "
    "necessarily by anyone here."
)


def askers(inbound: Sequence[InboundMessage]) -> dict[str, str]:
    """Who asks in a group turn: each sender's id with what they wrote ({} in a private chat).

    Collect mode answers the messages queued during a turn together, and they may come from several
    members: "what is my job?" means its own sender's job, not that of whoever wrote last."""
    said: dict[str, list[str]] = {}
    for message in inbound:
        if message.is_group and message.text:
            said.setdefault(message.sender_id, []).append(message.text)
    return {sender: "\n\n".join(texts) for sender, texts in said.items()}


class ContextBuildingSystem:
    """Sets ``turn.system_prompt`` = base prompt + ``# Memory`` (see bot/memory/prompt.py for the order).

    Without a memory service (memory disabled) the base prompt is used as is. With a context ``budget``
    the memory section gets what the model's window leaves it this turn (bot/context_budget.py).
    """

    name = "context"
    order = 20
    enabled = True

    def __init__(
        self, memory: MemoryService | None, base_prompt: str, *, budget: ContextBudget | None = None
    ) -> None:
        self._memory = memory
        self._base = base_prompt
        self._budget = budget

    def should_process(self, turn: Turn) -> bool:
        return turn.reply is None

    def anticipate(self, message: InboundMessage) -> None:
        """Start on the message's memory while the dispatcher stores it: its embedding is the longest
        wait of the context's work, and it runs in the model's thread meanwhile."""
        if self._memory is not None and message.text.strip():
            self._memory.prefetch(message.text)

    async def process(self, turn: Turn) -> None:
        base = self._base
        if any(m.is_group for m in turn.inbound):
            base = f"{base.rstrip()}\n\n{GROUP_NOTE}"
        turn.system_prompt = system_prompt(base, "")
        if self._memory is None:
            return
        context = await self._memory.context(
            turn.user_text,
            session_id=turn.session.id,
            now=turn.now,
            shown=[m.id for m in turn.session.messages],
            budget=self._budget.memory_budget(turn.session) if self._budget is not None else None,
            askers=askers(turn.inbound),
        )
        turn.memory_context = context.text
        turn.system_prompt = system_prompt(base, context.text)
        if self._budget is not None:
            self._budget.counted_prompt(turn.system_prompt, context.tokens)
        turn.diagnostics["memory"] = context.diagnostics
        pack = context.pack.diagnostics
        # Counts and scores only: what the user wrote and what memory holds stay out of the logs.
        log.info(
            "memory_recalled",
            items=len(pack.memories),
            candidates=pack.candidates,
            pack_tokens=pack.tokens,
            dropped_for_budget=pack.dropped_for_budget,
            stop=pack.recall.stop,
            memory_tokens=context.diagnostics.get("memory_tokens", 0),
            ms=pack.ms,
        )
        if pack.memories and log.is_enabled_for(logging.DEBUG):  # the list is built only when it is logged
            log.debug(
                "memory_recalled_items",
                chosen=[{k: c[k] for k in ("ids", "role", "score", "relevance")} for c in pack.chosen],
            )
