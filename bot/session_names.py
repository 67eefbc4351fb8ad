"""A chat's file names, from its session id: one name per id, safe in any folder, on any file system.

Every folder that keeps something per chat names it by :func:`encode_id`: the session's header and
logs (``bot/sessions.py``), the inbox, the kept answers gone stale, the tool-call journal, the
transcript archive and the chat-scope memory folder. One function for all of them keeps a chat's files
findable together (``membot sessions`` sums them, a move carries them along) and means a fix to the
encoding reaches every folder at once. A session's own two kinds of
file, its header and its logs, are named here too (:func:`header_file`, :func:`log_file`): the store
and the repairs of a load (``bot/session_repair.py``) find them by the same names.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-:.@+=")
_MAX_NAME = 120


def encode_id(sid: str) -> str:
    """A file name for ``sid`` that cannot leave the folder and cannot collide with another id.

    Unsafe characters (``/``, NUL, ``%``, spaces, non-ASCII...) are percent-encoded byte by byte, and a
    leading dot is encoded too, so ``..`` or a hidden name never appears. Names longer than the limit
    keep a readable prefix plus ``~`` and a hash of the full id; ``~`` is never produced otherwise.
    Case is kept: on a file system that ignores it (macOS's default), two ids that differ only in case
    would share a file. Telegram and Discord ids are numbers; the terminal's is the operator's user
    name (README, "Sessions").
    """
    out: list[str] = []
    for ch in sid:
        if ch in _SAFE:
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
    name = "".join(out)
    if name.startswith("."):
        name = "%2E" + name[1:]
    if not name:
        name = "%00empty"
    if len(name) > _MAX_NAME:
        digest = hashlib.sha256(sid.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        name = name[: _MAX_NAME - 40].rstrip("%0123456789ABCDEF") + "~" + digest
    return name


def glob_escape(name: str) -> str:
    """``name`` as a glob pattern that matches only itself, for finding an id's files as ``<name>.*``.
    :func:`encode_id` writes none of ``*?[]`` today; this keeps such a glob exact if the safe set grows."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


def header_file(directory: Path, sid: str) -> Path:
    """A session's header in the sessions folder: ``<name>.json``."""
    return directory / f"{encode_id(sid)}.json"


def log_file(directory: Path, sid: str, generation: int) -> Path:
    """A session's message log of one generation: ``<name>.<generation>.jsonl``."""
    return directory / f"{encode_id(sid)}.{generation}.jsonl"
