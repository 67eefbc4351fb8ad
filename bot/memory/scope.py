"""Chat scope: with ``memory.scope = "chat"`` each chat remembers only what was said in it.

Several people sharing one bot must not see each other's notes. So in chat scope every session id
(``<channel>:<chat>``) gets its own folder, ``memory/chats/<encode_id(session id)>/``, holding its
bot-written ``MEMORY.md`` and its daily notes; the workspace ``memory/MEMORY.md`` stays the operator's
file, shown to every chat and never written by the bot. Items keep living in the one item store: an
item belongs to the chats its ``references`` name, and retrieval looks only at those.

Folders are made on first write (0700, by ``bot.storage``), so a chat that never spoke leaves no trace.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from zoneinfo import ZoneInfo

from bot.memory.items import MemoryItem
from bot.memory.longterm import Limits, LongTermMemory
from bot.memory.notes import DailyNotes
from bot.session_names import encode_id

CHATS_DIR = "chats"


def belongs_to(item: MemoryItem, session_id: str) -> bool:
    """Whether ``item`` was learned in the chat ``session_id`` (one of its references names it)."""
    return any(ref.session_id == session_id for ref in item.references)


def may_see(session_id: str | None, item: MemoryItem, *, chat_scope: bool) -> bool:
    """Whether ``session_id`` may see ``item``; ``None`` is the operator, who sees everything."""
    return not chat_scope or session_id is None or belongs_to(item, session_id)


def of_chat(items: Iterable[MemoryItem], session_id: str) -> list[MemoryItem]:
    return [item for item in items if belongs_to(item, session_id)]


class ChatFolders:
    """The per-chat MEMORY.md and daily notes under ``memory/chats/``.

    One :class:`LongTermMemory` per chat is kept for the life of the service, so its lock serializes
    every bot write to that file (the compare-and-swap relies on it)::

        chats = ChatFolders(memory_root / "chats", tz)
        await chats.longterm("telegram:42").update(lambda text: text + "- likes tea\\n")
    """

    def __init__(
        self, root: Path, tz: ZoneInfo, *, limits: Limits = Limits(), read_only: bool = False
    ) -> None:
        self._root = root
        self._read_only = read_only
        self._tz = tz
        self._limits = limits
        self._longterm: dict[str, LongTermMemory] = {}
        self._notes: dict[str, DailyNotes] = {}

    @property
    def root(self) -> Path:
        return self._root

    def folder(self, session_id: str) -> Path:
        # encode_id never yields "", "." or "..", nor a "/": the folder is always a child of root.
        return self._root / encode_id(session_id)

    def longterm(self, session_id: str) -> LongTermMemory:
        found = self._longterm.get(session_id)
        if found is None:
            path = self.folder(session_id) / "MEMORY.md"
            found = self._longterm[session_id] = LongTermMemory(
                path, limits=self._limits, read_only=self._read_only
            )
        return found

    def notes(self, session_id: str) -> DailyNotes:
        found = self._notes.get(session_id)
        if found is None:
            found = self._notes[session_id] = DailyNotes(self.folder(session_id), self._tz)
        return found
