"""Why a write to MEMORY.md was not made: the errors of bot/memory/longterm.py, and the log of a refusal.

``Conflict`` asks the caller to read again; the others are tool errors (``ToolError``): their words
reach the model, which tells the user, and name what the operator can do.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from bot.tools import ToolError

log = structlog.get_logger(__name__)


class Conflict(Exception):
    """The file changed since it was read: the caller re-reads and re-merges."""


class MemoryFull(ToolError):
    """A bot write would grow MEMORY.md past its limit; the message says what to do instead."""


class NotUtf8(ToolError):
    """MEMORY.md holds bytes that are not UTF-8: a bot write would turn them into U+FFFD for good, so
    the bot does not write it until the operator saves it as UTF-8."""


class ReadOnly(ToolError):
    """The operator made MEMORY.md read-only (``chmod a-w``): they froze it, so the bot does not write
    it (a swap replaces the file whatever its mode, and root may write any file) until it is writable
    again. ``membot memory edit``, the operator's own save, still writes it."""


def read_only_refused(path: Path, writer: str) -> None:
    """Log that a write of ``writer`` to the read-only ``path`` was not made, with the fix."""
    log.error(
        "memory_file_read_only",
        file=str(path),
        writer=writer,
        hint=f"chmod u+w {path} to let the bot write it again; until then it adds nothing to it (a "
        "consolidation's summary still goes to HISTORY.md, and its facts to the items)",
    )
