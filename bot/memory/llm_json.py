"""Reading the JSON object a model was asked for, from whatever it actually wrote.

Three tiers, each more forgiving: (1) strip code fences and parse; (2) parse the first balanced
``{…}`` block in the text; (3) pull named string fields out one by one. Models wrap JSON in prose,
fences or half-finished objects often enough that all three earn their keep. Tier 3 takes only strings
whose closing quote is there: a string cut off mid-way is not a value. Its result is still a partial
reading of a broken answer, so callers decide what they may trust from it (consolidation never
replaces MEMORY.md from it).
"""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def parse_object(text: str, fields: tuple[str, ...]) -> tuple[dict[str, Any], int] | None:
    """The object in ``text`` and the tier that found it (1, 2 or 3), or ``None`` if nothing usable."""
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    candidate = fenced.group(1) if fenced else stripped
    parsed = _loads_object(candidate)
    if parsed is not None:
        return parsed, 1
    block = first_balanced_block(stripped)
    if block is not None:
        parsed = _loads_object(block)
        if parsed is not None:
            return parsed, 2
    found = {name: value for name in fields if (value := _extract_string(stripped, name)) is not None}
    return (found, 3) if found else None


def _loads_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def first_balanced_block(text: str) -> str | None:
    """The first ``{…}`` with balanced braces, ignoring braces inside JSON strings."""
    start = text.find("{")
    while start != -1:
        depth, in_string, escaped = 0, False, False
        for i in range(start, len(text)):
            ch = text[i]
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start : i + 1]
        start = text.find("{", start + 1)
    return None


def _extract_string(text: str, name: str) -> str | None:
    match = re.search(rf'"{re.escape(name)}"\s*:\s*"((?:[^"\\]|\\.)*)"', text, re.DOTALL)
    if match is None:
        return None
    raw = match.group(1)
    try:
        value = json.loads(f'"{raw}"')
    except ValueError:
        value = raw.replace('\\"', '"').replace("\\n", "\n")
    return str(value)


def as_text(value: Any) -> str:
    """Coerce a model-supplied value to text instead of failing on the wrong type."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(as_text(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)
