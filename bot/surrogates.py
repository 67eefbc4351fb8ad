"""Lone UTF-16 surrogates: the one kind of Python text that cannot be written as UTF-8.

JSON may carry them (``"\\ud800"`` is valid JSON), so a model's answer, a Telegram update or a Discord
message can hand membot a ``str`` that every later ``encode("utf-8")`` refuses: one such character in
an answer once made every save of that chat fail until a restart. Text is therefore scrubbed where it
enters (:class:`~bot.domain.InboundMessage`, :class:`~bot.llm.types.ChatResponse`), and storage encodes
through :func:`utf8`, so a stray surrogate that got in some other way still cannot stop a chat.
"""

from __future__ import annotations


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


def utf8(text: str) -> bytes:
    """``text`` as UTF-8; lone surrogates become U+FFFD instead of raising ``UnicodeEncodeError``."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return scrub(text).encode("utf-8")
