"""Files named by the old ``encode_id`` (bot/session_names.py), upper-case letters kept: renamed at start.

A chat's files are named by its session id (sessions, inbox, kept answers gone stale, the tool-call
journal, the transcript archive, the chat-scope memory folder). The old names kept upper-case letters,
so ``cli:Bob`` and ``cli:bob`` (two terminal users) were ``cli:Bob.json`` and ``cli:bob.json``: one file
on a file system that does not tell case apart (macOS's default APFS, Windows), which the two chats
shared and overwrote. Today's names write upper-case letters as ``%XX``. The files of an id with an
upper-case letter are renamed to today's names (:func:`rename_legacy_names`) at each start, under the
workspace lock and before anything reads them; ids without one (every Telegram and Discord chat, most
terminal users) keep their names, and nothing else is touched.

Each rename is atomic, and a start finishes what a kill left (a file still under its old name is
renamed then). Kept under its old name, and logged (``legacy_name_kept``): a name cut short with a hash
(the id cannot be read back from it), and one whose new name is taken. A file two chats already shared
on such a file system goes to the id whose spelling it has: what was mixed cannot be told apart again
(a session header naming the other id is then moved aside by the store, as any such header is).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

import structlog

from bot.session_names import LEGACY_SAFE, encode_id
from bot.storage import fsync_dir

log = structlog.get_logger(__name__)

# What follows the id in a name, per kind of folder: a session's header and logs; one file per chat; a
# folder per chat.
SESSION_FILES = re.compile(r"(?P<suffix>\.json|\.\d+\.jsonl)\Z")
CHAT_FILES = re.compile(r"(?P<suffix>\.jsonl)\Z")
CHAT_FOLDERS = re.compile(r"(?P<suffix>)\Z")

_ESCAPE = re.compile(r"%[0-9A-F]{2}")
_UPPER = re.compile(r"[A-Z]")


def rename_legacy_names(folders: list[tuple[Path, re.Pattern[str]]]) -> int:
    """Rename each old name in ``folders`` (each with the pattern of what follows the id in its names)
    to today's (blocking); returns how many were renamed."""
    renamed = 0
    for folder, suffix in folders:
        moved = 0
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            continue
        # A session's logs before its header (after a kill in between, a start reads neither).
        for name in sorted(names, key=lambda n: (n.endswith(".json"), n)):
            new = _new_name(name, suffix, folder)
            if new is None:
                continue
            if (folder / new).exists():
                log.warning(
                    "legacy_name_kept",
                    path=str(folder / name),
                    reason=f"{new} exists already",
                    fix=f"merge {name} into {new} by hand, or delete the one not wanted",
                )
                continue
            os.rename(folder / name, folder / new)
            moved += 1
        if moved:
            fsync_dir(folder)
            log.info("legacy_names_renamed", folder=str(folder), count=moved)
            renamed += moved
    return renamed


def _new_name(name: str, suffix: re.Pattern[str], folder: Path) -> str | None:
    """Today's name for an old one (``None`` when ``name`` is not one, or cannot be read back)."""
    found = suffix.search(name)
    if found is None:
        return None
    stem = name[: found.start()]
    if not stem or not _UPPER.search(_ESCAPE.sub("", stem)):
        return None  # today's name already (or no chat's file)
    if "~" in stem:
        log.warning(
            "legacy_name_kept",
            path=str(folder / name),
            reason="a long id's name, cut short with a hash: the id cannot be read back from it",
            fix="none needed unless two ids differ only in case on this file system",
        )
        return None
    sid = unquote(stem, errors="surrogatepass")
    if encode_id(sid, safe=LEGACY_SAFE) != stem:
        return None  # not a name encode_id ever wrote (put there by hand): left alone
    return encode_id(sid) + found.group("suffix")
