"""What a consolidation answer holds, and whether its MEMORY.md can be trusted to replace the file.

An answer is used whole or not at all, and MEMORY.md is replaced only from an answer that can be
trusted to hold all of it (:func:`memory_problem`): not from one cut at the output limit (a tester saw
160 facts become 106, once 5 MB become 8 bytes), not from a partial parse, not from anything but a
string, not beyond the size limit, and not when it drops most lines without saying why.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.memory.items import ItemType
from bot.memory.llm_json import as_text, parse_object
from bot.memory.pending import DurableFact

FIELDS = ("history_entry", "memory_update", "memory_pruned")
MAX_FACT_CHARS = 1000
DURABLE_TYPES = {t.value for t in ItemType} - {ItemType.EPISODE.value}
MIN_LINES_TO_GUARD = 6  # below this, "most lines" is too few to judge: only dropping all of them is
# Answers models give for memory_pruned when they pruned nothing: no reason for dropping lines.
NO_REASONS = frozenset(
    {"none", "n/a", "na", "nothing", "no", "null", "nil", "-", "no changes", "nothing pruned"}
)


@dataclass(frozen=True, slots=True)
class Reply:
    """A consolidation answer as read: ``tier`` is the parsing tier (3: fields picked out of a broken
    answer); ``memory_update`` is None when absent, ``memory_type`` the JSON type it came as."""

    history_entry: str
    memory_update: str | None
    facts: list[DurableFact]
    tier: int
    memory_type: str = "str"
    memory_pruned: str = ""


def parse_reply(text: str, *, max_fact_chars: int = MAX_FACT_CHARS) -> Reply | None:
    """The answer's fields, or None when it holds nothing usable."""
    found = parse_object(text, FIELDS)
    if found is None:
        return None
    data, tier = found
    entry = as_text(data.get("history_entry")).strip()
    update = data.get("memory_update")
    memory = update if isinstance(update, str) else (None if update is None else as_text(update))
    facts = _facts(data.get("items"), max_fact_chars)
    if not entry and memory is None and not facts:
        return None
    return Reply(
        entry,
        memory,
        facts,
        tier,
        memory_type=type(update).__name__,
        memory_pruned=as_text(data.get("memory_pruned")).strip(),
    )


def memory_problem(reply: Reply, current: str, *, max_bytes: int) -> str:
    """Why ``reply.memory_update`` must not replace ``current`` ("" when it may)."""
    update = reply.memory_update
    if update is None or (reply.memory_type == "str" and not update.strip()):
        return ""  # no update (a blank one is ignored too)
    if reply.memory_type != "str":
        return f"memory_update was a JSON {reply.memory_type}, not the text of the file"
    if reply.tier == 3:
        return "the answer was not valid JSON, so memory_update may be incomplete"
    size, before = len(update.encode("utf-8")), len(current.encode("utf-8"))
    if size > max_bytes and size > before:
        return f"memory_update is {size} bytes, over the limit of {max_bytes} (memory.max_memory_hard_size)"
    lines = [line for line in current.splitlines() if line.strip()]
    kept = set(update.splitlines())
    reason = reply.memory_pruned.strip().strip(".").lower()
    if reason in NO_REASONS or len(reason) < 4:  # "none" or "N/A" gives no reason for a loss
        left = sum(line in kept for line in lines)
        if (left * 2 < len(lines) and len(lines) >= MIN_LINES_TO_GUARD) or (left == 0 and len(lines) >= 2):
            return f"memory_update keeps {left} of {len(lines)} lines and gives no reason (memory_pruned)"
    return ""


def _facts(raw: object, max_chars: int) -> list[DurableFact]:
    out: list[DurableFact] = []
    if not isinstance(raw, list):
        return out
    for entry in raw:
        if not isinstance(entry, dict):
            continue
        kind, content = (
            as_text(entry.get("type")).strip().lower().replace(" ", "_"),
            as_text(entry.get("content")),
        )
        if kind not in DURABLE_TYPES or not content.strip() or len(content.strip()) > max_chars:
            continue
        try:
            confidence = min(1.0, max(0.0, float(entry.get("confidence", 0.8))))
        except (TypeError, ValueError):
            confidence = 0.8
        out.append(DurableFact(ItemType(kind), content.strip(), confidence))
    return out
