"""The memory tool translates the model's requests into the memory service's operations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from bot.tools import ToolContext, ToolError
from bot.tools.memory import MemoryRecord, MemoryTool

CTX = ToolContext("telegram:42", "telegram", "turn1")


class InMemory:
    """An honest, tiny implementation of MemoryOps."""

    def __init__(self) -> None:
        self.items: dict[str, MemoryRecord] = {}
        self.long_term: list[str] = []
        self.sources: dict[str, str] = {}

    async def add(self, text: str, *, kind: str, long_term: bool, session_id: str) -> MemoryRecord:
        record = MemoryRecord(f"m{len(self.items) + 1}", text, kind, "episodic")
        self.items[record.id] = record
        self.sources[record.id] = session_id
        if long_term:
            self.long_term.append(text)
        return record

    async def search(self, query: str, *, limit: int) -> Sequence[MemoryRecord]:
        words = query.lower().split()
        hits = [r for r in self.items.values() if any(w in r.text.lower() for w in words)]
        return [MemoryRecord(r.id, r.text, r.kind, r.layer, 1.0) for r in hits[:limit]]

    async def update(self, item_id: str, text: str) -> MemoryRecord | None:
        old = self.items.get(item_id)
        if old is None:
            return None
        self.items[item_id] = MemoryRecord(item_id, text, old.kind, old.layer)
        return self.items[item_id]

    async def promote(self, item_id: str) -> MemoryRecord | None:
        old = self.items.get(item_id)
        if old is None:
            return None
        self.items[item_id] = MemoryRecord(item_id, old.text, old.kind, "semantic")
        return self.items[item_id]

    async def forget(self, item_id: str) -> bool:
        return self.items.pop(item_id, None) is not None


async def call(tool: MemoryTool, **args: Any) -> str:
    return await tool.run(args, CTX)


async def test_add_search_update_promote_forget() -> None:
    memory = InMemory()
    tool = MemoryTool(memory)
    added = await call(tool, action="add", text="Alice prefers tea", kind="preference", long_term=True)
    assert added == "Remembered and added to MEMORY.md: [m1] (episodic/preference) Alice prefers tea"
    assert memory.long_term == ["Alice prefers tea"] and memory.sources["m1"] == "telegram:42"

    assert "[m1] (episodic/preference) score=1.00 Alice prefers tea" in await call(
        tool, action="search", query="tea"
    )
    assert "Updated: [m1]" in await call(tool, action="update", id="m1", text="Alice prefers green tea")
    assert "Promoted: [m1] (semantic/preference)" in await call(tool, action="promote", id="m1")
    assert await call(tool, action="forget", id="m1") == "Forgot m1."
    assert await call(tool, action="search", query="tea") == "Nothing remembered matches 'tea'."


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ({"action": "add", "text": "  "}, "text must not be empty"),
        ({"action": "add", "text": "x", "kind": "gossip"}, "kind must be one of"),
        ({"action": "add", "text": "x", "long_term": "yes"}, "long_term must be true or false"),
        ({"action": "update", "id": "nope", "text": "x"}, "no memory item has id 'nope'"),
        ({"action": "forget", "id": "nope"}, "no memory item has id 'nope'"),
        ({"action": "search", "query": "x", "limit": "many"}, "must be an integer"),
        ({"action": "explode"}, "unknown action"),
        ({}, "missing argument 'action'"),
    ],
)
async def test_mistakes_are_tool_errors(args: dict[str, Any], reason: str) -> None:
    with pytest.raises(ToolError, match=reason):
        await MemoryTool(InMemory()).run(args, CTX)
