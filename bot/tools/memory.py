"""The ``memory`` tool: lets the model add, search, update, promote and forget what membot remembers.

The tool only translates between the model and the memory service; it codes against :class:`MemoryOps`,
the few operations it needs, so the memory layer can evolve behind an adapter (bot/memory provides one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bot.tools.base import ToolContext, ToolError, int_arg, string_arg

KINDS = ("fact", "preference", "decision", "constraint", "task_state", "failure", "fix", "command_result")
ACTIONS = ("add", "search", "update", "promote", "forget")

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": list(ACTIONS)},
        "text": {"type": "string", "description": "What to remember (add) or the new wording (update)."},
        "kind": {"type": "string", "enum": list(KINDS), "description": "For add; default 'fact'."},
        "long_term": {
            "type": "boolean",
            "description": "For add: also keep it in MEMORY.md, the long-term facts shown in every chat.",
        },
        "query": {"type": "string", "description": "For search."},
        "limit": {"type": "integer", "description": "For search; 1-20, default 8."},
        "id": {
            "type": "string",
            "description": "Item id from search results (update/promote/forget).",
        },
    },
    "required": ["action"],
}


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    """One remembered item as the model sees it."""

    id: str
    text: str
    kind: str = ""
    layer: str = ""
    score: float | None = None


class MemoryOps(Protocol):
    """What the memory tool needs from the memory service.

    ``add`` with ``long_term=True`` also records the fact in MEMORY.md through its compare-and-swap.
    ``update``/``promote`` return ``None`` and ``forget`` returns ``False`` for an unknown id.
    """

    async def add(self, text: str, *, kind: str, long_term: bool, session_id: str) -> MemoryRecord: ...

    async def search(self, query: str, *, limit: int) -> Sequence[MemoryRecord]: ...

    async def update(self, item_id: str, text: str) -> MemoryRecord | None: ...

    async def promote(self, item_id: str) -> MemoryRecord | None: ...

    async def forget(self, item_id: str) -> bool: ...


class MemoryTool:
    """The model's handle on memory; every answer names item ids so later calls can refer to them."""

    name = "memory"
    description = (
        "Work with your long-term memory: 'add' a fact, preference or decision worth keeping; 'search' "
        "what you remember; 'update' or 'forget' an item by id; 'promote' an item so it is kept for good."
    )
    parameters = _SCHEMA

    def __init__(self, memory: MemoryOps) -> None:
        self._memory = memory

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        action = string_arg(args, "action")
        if action == "add":
            return await self._add(args, ctx)
        if action == "search":
            return await self._search(args)
        if action == "forget":
            item_id = string_arg(args, "id")
            if not await self._memory.forget(item_id):
                raise _unknown(item_id)
            return f"Forgot {item_id}."
        if action in ("update", "promote"):
            item_id = string_arg(args, "id")
            changed = (
                await self._memory.update(item_id, _text(args))
                if action == "update"
                else await self._memory.promote(item_id)
            )
            if changed is None:
                raise _unknown(item_id)
            return f"{'Updated' if action == 'update' else 'Promoted'}: {_line(changed)}"
        raise ToolError(f"unknown action {action!r}; use one of {', '.join(ACTIONS)}")

    async def _add(self, args: dict[str, Any], ctx: ToolContext) -> str:
        text = _text(args)
        kind = string_arg(args, "kind", default="fact")
        if kind not in KINDS:
            raise ToolError(f"kind must be one of {', '.join(KINDS)}")
        long_term = args.get("long_term", False)
        if not isinstance(long_term, bool):
            raise ToolError("long_term must be true or false")
        record = await self._memory.add(text, kind=kind, long_term=long_term, session_id=ctx.session_id)
        return f"Remembered{' and added to MEMORY.md' if long_term else ''}: {_line(record)}"

    async def _search(self, args: dict[str, Any]) -> str:
        query = string_arg(args, "query")
        limit = int_arg(args, "limit", default=8, low=1, high=20)
        found = await self._memory.search(query, limit=limit)
        if not found:
            return f"Nothing remembered matches {query!r}."
        return "\n".join(_line(r) for r in found)


def _text(args: dict[str, Any]) -> str:
    text = string_arg(args, "text").strip()
    if not text:
        raise ToolError("text must not be empty")
    return text


def _unknown(item_id: str) -> ToolError:
    return ToolError(f"no memory item has id {item_id!r}; search first to find the id")


def _line(record: MemoryRecord) -> str:
    label = "/".join(p for p in (record.layer, record.kind) if p)
    score = f" score={record.score:.2f}" if record.score is not None else ""
    return f"[{record.id}]{f' ({label})' if label else ''}{score} {record.text}"
