"""Token counts as a server reported them, read without ever failing the answer they came with.

A count is bookkeeping, the answer is what the user waits for (and was paid for): a ``usage`` field
that is no count (``"n/a"``, ``12.5``, a list) must not throw a good answer away and ask again. It
reads as 0, and a warning (``llm_usage_malformed``, with the field and the type of what came) tells
the operator. A missing or null count is simply 0: servers that do not count (some local ones) send
nothing, or null, for every call. An input or output count that reads as 0 is then estimated by the
client (estimates.py), so the day's ledger is not short by that call.
"""

from __future__ import annotations

from typing import Any

import structlog

log = structlog.get_logger(__name__)


def token_count(usage: dict[str, Any], field: str, *, model: str, where: str) -> int:
    """``usage[field]`` as a whole number of tokens; 0 when it is missing, null or no count."""
    value = usage.get(field)
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)  # 12.0: the number 12 as some servers write it
    malformed(field, value, model=model, where=where)
    return 0


def usage_object(value: Any, field: str, *, model: str, where: str) -> dict[str, Any]:
    """A ``usage`` (or ``*_details``) object; anything else but null is logged and read as empty."""
    if isinstance(value, dict):
        return value
    if value is not None:
        malformed(field, value, model=model, where=where)
    return {}


def malformed(field: str, value: Any, *, model: str, where: str) -> None:
    log.warning(
        "llm_usage_malformed",
        model=model,
        server=where,
        field=field,
        value_type=type(value).__name__,
        counted_as=0,
    )
