"""Lone UTF-16 surrogates: the one kind of Python text that cannot be written as UTF-8.

JSON may carry them (``"\\ud800"`` is valid JSON), so a model's answer, a Telegram update or a Discord
message can hand membot a ``str`` that every later ``encode("utf-8")`` refuses: one such character in
an answer once made every save of that chat fail until a restart. Text is therefore scrubbed where it
enters (:class:`~bot.domain.InboundMessage`, :class:`~bot.llm.types.ChatResponse`, whose tool-call
arguments are checked as decoded JSON), and storage encodes through :func:`utf8`, so a stray surrogate
that got in some other way still cannot stop a chat.
"""

from __future__ import annotations

import json
import re
from typing import Any

_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # "\ud83d" in JSON text: a surrogate once decoded


def scrub(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (the same object when there is none).

    A well-formed pair that arrived as two code points is joined into its character, not replaced.
    """
    if text.isascii():  # the common case, in nanoseconds
        return text
    try:
        text.encode("utf-8")  # fails on surrogates only; several times faster than searching for them
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def scrub_json_text(text: str) -> str:
    """JSON text (a tool call's arguments) that decodes to no lone surrogate. Scrubbing the text is not
    enough: an escape (``"\\ud83d"``) is plain ASCII until it is decoded. Text that is not JSON is
    only scrubbed; it stays as it was unless a decoded string held a lone surrogate."""
    text = scrub(text)
    if not _ESCAPED_SURROGATE.search(text):
        return text
    try:
        value = json.loads(text)
        cleaned = scrub_json(value)
    except (ValueError, RecursionError):  # no JSON, or nested too deeply: the tool loop says so
        return text
    return text if cleaned == value else json.dumps(cleaned, ensure_ascii=False)


def scrub_json(value: Any) -> Any:
    """Decoded JSON with every string scrubbed."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [scrub_json(v) for v in value]
    if isinstance(value, dict):
        return {scrub(k): scrub_json(v) for k, v in value.items()}
    return value


def utf8(text: str) -> bytes:
    """``text`` as UTF-8; lone surrogates become U+FFFD instead of raising ``UnicodeEncodeError``."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return scrub(text).encode("utf-8")
