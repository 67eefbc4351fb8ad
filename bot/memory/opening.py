"""Opening memory's folder at the bot's start: private folders and modes, the item layers loaded and repaired.

The running bot's start (:func:`open_folder`) makes ``memory/`` and its folders private (0700, files
0600 at most: a file its owner made read-only stays so), reads the marker of writes a previous run may
have lost (lazy_sync.py), loads the item layers, takes out of its log the fragment of a record a kill
cut short, and in chat scope separates the items an earlier version merged across chats, warning once
that a MEMORY.md written while the scope was "workspace" is the operator's now. It is the first half of
``MemoryService.start`` (service.py), which then starts the read path and resumes consolidations; a
read-only service only loads the items.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path

import structlog

from bot.memory.item_store import ItemStore
from bot.memory.lazy_sync import LazySync
from bot.memory.longterm import READ_MARGIN
from bot.memory.scope import ChatFolders
from bot.storage import ensure_private_dir, fix_private_tree

log = structlog.get_logger(__name__)


async def open_folder(
    root: Path,
    items: ItemStore,
    chats: ChatFolders,
    lazy: LazySync,
    memory_file: Path,
    *,
    chat_scope: bool,
    compact_damaged: bool,
) -> datetime | None:
    """Make ``root`` private and load ``items``, repaired; returns since when a previous run's writes
    may be lost (``lazy``'s marker: see ``MemoryService.recover``). ``memory_file``: the workspace
    MEMORY.md. ``compact_damaged``: the running bot, which may rewrite item logs."""
    first_in_chat_scope = chat_scope and not await asyncio.to_thread(chats.root.exists)
    fixed = await asyncio.to_thread(_prepare, root, chats, chat_scope)
    if fixed:
        log.warning("memory_permissions_fixed", count=fixed, root=str(root))
    unsynced_since = await asyncio.to_thread(lazy.left_by_last_run)
    await items.load()
    if compact_damaged and items.damaged:
        # A kill cut a record short (an append crossing a page): its message is recorded again,
        # and the fragment, kept aside, leaves the middle of its log now.
        await items.compact()
    if chat_scope and (split := await items.separate_chats()):
        # Merged across chats by an earlier version (or while the scope was "workspace").
        log.warning("memory_items_separated_by_chat", count=split)
    if first_in_chat_scope and len(items) and await asyncio.to_thread(_longterm_written, memory_file):
        # The bot wrote MEMORY.md while the scope was "workspace", from every chat; it is the
        # operator's now, and every chat is shown it.
        log.warning(
            "memory_scope_now_chat",
            path=str(memory_file),
            hint="memory.scope is 'chat' now, but this file holds what the bot learned in any chat "
            "while it was 'workspace', and every chat is shown it: move personal facts out of it",
        )
    return unsynced_since


def _longterm_written(memory_file: Path) -> bool:
    """Whether MEMORY.md holds anything: its start says (a multi-GB one is not read whole)."""
    try:
        with open(memory_file, "rb") as f:
            return bool(f.read(READ_MARGIN).strip())
    except OSError:
        return False


def _prepare(root: Path, chats: ChatFolders, chat_scope: bool) -> int:
    for folder in (
        root,
        root / "archive",
        root / "items",
        root / "items" / "episodic",
        *([chats.root] if chat_scope else []),
    ):
        ensure_private_dir(folder)
    return fix_private_tree(root)
