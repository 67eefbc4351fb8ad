"""The ``memory`` tool the model calls: add, search, search_archive, update, promote, forget.

:class:`MemoryTool` has the shape of ``bot.tools.base.Tool`` (name, description, parameters,
``run(args, ctx)``), so the tool-loop registry can offer it as is. The operations are also plain
async methods (:class:`MemoryToolOps`) for other callers. Long-term facts (``layer="long_term"``) go
to MEMORY.md through the same compare-and-swap as every bot write.

Every operation takes the asking session's id: in chat scope (``memory.scope = "chat"``) long-term
writes go to the chat's own MEMORY.md, and search, update, promote and forget see only items that chat
told, so an id from another chat is as unknown as a made-up one.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

from bot.memory.archive import search_archive
from bot.memory.items import ItemType, Layer, MemoryItem, Reference, make_title
from bot.memory.memories import key_of
from bot.memory.service import MemoryService
from bot.memory.words import tokenize
from bot.tools import ToolContext, ToolError

LONG_TERM = "long_term"
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {
            "type": "string",
            "enum": ["add", "search", "search_archive", "update", "promote", "forget"],
        },
        "content": {"type": "string", "description": "add/update: the memory, one self-contained sentence"},
        "query": {
            "type": "string",
            "description": "search: what to look for; search_archive: words every message found must hold",
        },
        "id": {"type": "string", "description": "update/promote/forget: an item id from search results"},
        "type": {"type": "string", "enum": [t.value for t in ItemType if t is not ItemType.EPISODE]},
        "layer": {"type": "string", "enum": ["semantic", "procedural", "episodic", LONG_TERM]},
        "k": {"type": "integer", "minimum": 1, "maximum": 20},
    },
    "required": ["action"],
}
DESCRIPTION = (
    "Long-term memory. add: remember a fact, preference, decision or how-to (layer long_term writes "
    "MEMORY.md, which is always shown to you: a long one in part). search: find memories and MEMORY.md "
    "lines. search_archive: find past messages word for word in the full transcript (a line of a pasted "
    "log, an exact name). update/promote/forget: "
    "change, make durable, or delete a memory by id (forget by id deletes the whole message it came from); "
    "forget with content removes the MEMORY.md line that "
    "says it (quote the line: a few words found in several lines remove nothing)."
)


class MemoryToolOps:
    """The operations behind the tool, as plain async methods returning text for the model."""

    def __init__(self, memory: MemoryService) -> None:
        self._memory = memory

    async def add(
        self, content: str, *, type: str = "fact", layer: str = "semantic", session_id: str = ""
    ) -> str:
        text = content.strip()
        if not text:
            raise ToolError("add needs non-empty 'content'")
        self._check_length(text)
        if layer == LONG_TERM:
            line = f"- {' '.join(text.split())}"
            await self._memory.longterm_for(session_id).update(lambda old: _append_line(old, line))
            return "Saved to MEMORY.md."
        item_type, item_layer = _parse_type(type), _parse_layer(layer)
        now = self._memory.now()
        item = MemoryItem(
            layer=item_layer,
            type=item_type,
            title=make_title(text),
            content=text,
            source="tool",
            confidence=0.9,
            salience=0.8,
            created_at=now,
            updated_at=now,
            last_accessed_at=now,
            references=(Reference(session_id),),
        )
        stored = await self._memory.items.add(item)
        return f"Saved as {stored.id} ({stored.layer.value}/{stored.type.value})."

    async def search(self, query: str, *, k: int = 5, session_id: str = "") -> str:
        if not query.strip():
            raise ToolError("search needs a 'query'")
        k = max(1, min(20, k))
        found = await self._memory.search(query, k=k, touch=True, session_id=session_id)
        snap = await self._memory.longterm_for(session_id).read()
        lines = [f"[MEMORY.md] {line.strip()[:500]}" for line in _lines_about(snap.text, query, k)]
        if not found and not lines:
            return "No matching memories."
        return "\n".join(
            [
                *lines,
                *(
                    f"{s.item.id} [{s.item.layer.value}/{s.item.type.value}, "
                    f"{s.item.created_at.astimezone(self._memory.tz):%Y-%m-%d}] {s.item.content[:500]}"
                    for s in found
                ),
            ]
        )

    async def search_archive(self, query: str, *, k: int = 5, session_id: str = "") -> str:
        words = query.split()
        if not words:
            raise ToolError("search_archive needs a 'query' (the exact words to find)")
        memory = self._memory
        hits = await asyncio.to_thread(
            search_archive,
            memory.archive.directory,
            words,
            session_id=session_id if memory.chat_scope else None,  # a chat sees only its own transcript
            limit=max(1, min(20, k)),
        )
        if not hits:
            return "No archived message holds all of those words."
        return "\n\n".join(
            f"[{h.message.timestamp.astimezone(memory.tz):%Y-%m-%d %H:%M}, {h.message.role.value}] "
            + h.excerpt
            for h in hits
        )

    async def update(self, item_id: str, content: str, *, session_id: str = "") -> str:
        item = self._get(item_id, session_id)
        if not content.strip():
            raise ToolError("update needs non-empty 'content'")
        self._check_length(content.strip())
        now = self._memory.now()
        text = content.strip()
        # The new content is stated now: dated as of the update, never as old as what it replaced.
        updated = item.with_changes(content=text, title=make_title(text), created_at=now, updated_at=now)
        if key_of(item)[0] != "item":
            # Part of a message, which recall shows as it was said: the correction leaves the message
            # (kept as what was said then) and stands as a fact of its own.
            item_type = ItemType.FACT if item.type is ItemType.EPISODE else item.type
            chat = Reference(item.references[0].session_id)
            updated = updated.with_changes(source="tool", type=item_type, references=(chat,))
        await self._memory.items.put(updated)
        return f"Updated {item_id}."

    async def promote(self, item_id: str, *, session_id: str = "") -> str:
        item = self._get(item_id, session_id)
        if item.layer is not Layer.EPISODIC:
            return f"{item_id} is already {item.layer.value}."
        now = self._memory.now()
        sure = item.with_changes(confidence=max(item.confidence, 0.95), updated_at=now)
        await self._memory.items.put(sure)
        promoted = await self._memory.items.promote(now, self._memory.settings.promotion_confidence, [sure])
        target = next((p for p in promoted if p.references == item.references), None)
        return (
            f"Promoted {item_id} to {target.layer.value} as {target.id}."
            if target
            else f"{item_id} stays episodic."
        )

    async def forget(self, item_id: str = "", content: str = "", *, session_id: str = "") -> str:
        if item_id:
            item = self._get(item_id, session_id)
            now = self._memory.now()
            key = key_of(item)
            if key[0] == "item":
                await self._memory.items.delete(item_id, now)
                return f"Forgot {item_id}."
            # An item of a message is one of several (its passages, typed sentences, a promoted copy),
            # and recall shows the message: deleting the one item left the message to come up as before.
            family = [
                i for i in self._memory.items.index.of_message(key) if self._memory.visible(i, session_id)
            ]
            gone = {i.id: i for i in (item, *family)}
            await self._memory.items.put_many(
                i.with_changes(deleted=True, updated_at=now) for i in gone.values()
            )
            return (
                f"Forgot {item_id} and the message it came from: it no longer comes up "
                "(the transcript archive keeps it)."
            )
        needle = _line_text(content)
        if not re.search(r"\w", needle):  # ("-" matched, as a whole word, any one line holding " - ")
            raise ToolError("forget needs an 'id' or the words of the MEMORY.md line to remove ('content')")
        removed: list[str] = []

        def drop(text: str) -> str:
            lines = text.splitlines()
            removed[:] = _lines_to_forget(lines, needle)
            if not removed:
                return text
            gone = set(removed)
            kept = [line for line in lines if line not in gone]
            return "\n".join(kept) + "\n" if kept else ""

        await self._memory.longterm_for(session_id).update(drop)
        return f"Removed {len(removed)} line(s) from MEMORY.md." if removed else "No MEMORY.md line matched."

    def _check_length(self, text: str) -> None:
        """A memory is one fact; a page of text (once a 5 MB "fact") is refused, not stored."""
        limit = self._memory.settings.max_fact_chars
        if len(text) > limit:
            raise ToolError(
                f"that memory is {len(text)} characters, over the {limit}-character limit for one fact; "
                "store the essential fact in a sentence or two (split several facts into several adds)"
            )

    def _get(self, item_id: str, session_id: str) -> MemoryItem:
        item = self._memory.items.get(item_id.strip())
        if item is None or not self._memory.visible(item, session_id):
            raise ToolError(f"no memory with id {item_id!r}; search first to get ids")
        return item


def _lines_about(text: str, query: str, k: int) -> list[str]:
    """The MEMORY.md lines that hold at least half of the query's words (at least one), most first: a
    long file is shown only in part, and what the bot added last is at its end."""
    asked = set(tokenize(query))
    if not asked:
        return []
    scored: list[tuple[int, int, str]] = []
    for n, line in enumerate(text.splitlines()):
        if line.strip() and not line.lstrip().startswith("#"):
            shared = len(asked.intersection(tokenize(line)))
            if shared and shared * 2 >= len(asked):
                scored.append((-shared, n, line))
    return [line for _, _, line in sorted(scored)[:k]]


def _line_text(line: str) -> str:
    """A MEMORY.md line as compared: no list marker, lower case, spaces folded."""
    return " ".join(line.strip().removeprefix("- ").removeprefix("* ").split()).lower()


def _lines_to_forget(lines: Sequence[str], needle: str) -> list[str]:
    """The lines ``forget`` removes: those that say exactly ``needle``; else the one line holding it as
    whole words. A few letters matching inside several lines ("tea" in "Steam", "Team lead") must not
    delete them all: then the lines are listed and nothing goes."""
    exact = [line for line in lines if _line_text(line) == needle]
    if exact:
        return exact
    words = re.compile(rf"(?<!\w){re.escape(needle)}(?!\w)")
    found = [line for line in lines if not line.lstrip().startswith("#") and words.search(_line_text(line))]
    if len(found) > 1:
        shown = "; ".join(repr(line.strip()) for line in found[:5])
        raise ToolError(
            f"{len(found)} MEMORY.md lines mention {needle!r} ({shown}); nothing was removed. "
            "Call forget again with the whole line to remove, once per line."
        )
    return found


class MemoryTool:
    """``bot.tools.base.Tool`` adapter: one tool named ``memory`` with an ``action`` argument."""

    name = "memory"
    description = DESCRIPTION
    parameters = PARAMETERS

    def __init__(self, memory: MemoryService) -> None:
        self.ops = MemoryToolOps(memory)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        action = str(args.get("action", ""))
        content, item_id = _text(args, "content"), _text(args, "id")
        if action == "add":
            return await self.ops.add(
                content,
                type=_text(args, "type") or "fact",
                layer=_text(args, "layer") or "semantic",
                session_id=ctx.session_id,
            )
        sid = ctx.session_id
        if action == "search":
            query = _text(args, "query") or content
            return await self.ops.search(query, k=_int(args.get("k"), 5), session_id=sid)
        if action == "search_archive":
            query = _text(args, "query") or content
            return await self.ops.search_archive(query, k=_int(args.get("k"), 5), session_id=sid)
        if action == "update":
            return await self.ops.update(item_id, content, session_id=sid)
        if action == "promote":
            return await self.ops.promote(item_id, session_id=sid)
        if action == "forget":
            return await self.ops.forget(item_id, content, session_id=sid)
        raise ToolError(
            f"unknown action {action!r}; use add, search, search_archive, update, promote or forget"
        )


def _text(args: dict[str, Any], key: str) -> str:
    """The text argument ``key`` ("" when absent); a number is taken as its digits. Anything else is
    refused: a JSON object or list was stored as its Python text ("{'fact': 'x'}") as if it were one."""
    value = args.get(key)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise ToolError(f"argument {key!r} must be a string, not a JSON {_json_type(value)}")


def _json_type(value: object) -> str:
    return {dict: "object", list: "array", bool: "boolean"}.get(type(value), type(value).__name__)


def _append_line(text: str, line: str) -> str:
    if line in text.splitlines():
        return text
    return (text.rstrip("\n") + "\n" if text.strip() else "") + line + "\n"


def _parse_type(value: str) -> ItemType:
    try:
        return ItemType(value.strip().lower().replace(" ", "_"))
    except ValueError:
        raise ToolError(f"unknown type {value!r}") from None


def _parse_layer(value: str) -> Layer:
    try:
        return Layer(value.strip().lower())
    except ValueError:
        raise ToolError(f"unknown layer {value!r}") from None


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # (OverflowError: ``1e999``, infinity to Python's JSON)
        return default
