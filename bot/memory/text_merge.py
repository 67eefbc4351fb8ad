"""Putting the bot's change into the operator's MEMORY.md: a line-level three-way merge, and the file's style.

Pure text functions: bot/memory/longterm.py applies them under its lock, consolidation.py to tell a
changed file from one returned as it was.
"""

from __future__ import annotations

BOM = "\ufeff"


def merge_lines(base: str, ours: str, theirs: str) -> str:
    """A line-level three-way merge that favours ``theirs`` (the operator's version), BOM and all (a
    first line told apart by a BOM alone was taken for a changed line, and moved to the end)."""
    bom = BOM if theirs.startswith(BOM) else ""
    base, ours, theirs = base.removeprefix(BOM), ours.removeprefix(BOM), theirs.removeprefix(BOM)
    base_lines, our_lines = base.splitlines(), ours.splitlines()
    removed = set(base_lines) - set(our_lines)
    added = [line for line in our_lines if line not in set(base_lines)]
    kept = [line for line in theirs.splitlines() if line not in removed or not line.strip()]
    present = set(kept)
    merged = kept + [line for line in added if line not in present]
    return bom + "\n".join(merged).rstrip("\n") + "\n" if merged else bom


def in_style_of(base: str, new: str) -> str:
    """``new`` with ``base``'s line endings and byte-order mark: a file a Windows editor saved (CRLF,
    a BOM), or git checked out with autocrlf, stays so; the model and the merge write LF lines."""
    if base.startswith(BOM) and not new.startswith(BOM):
        new = BOM + new
    if base.count("\r\n") * 2 > base.count("\n"):  # mostly CRLF lines
        new = new.replace("\r\n", "\n").replace("\n", "\r\n")
    return new
