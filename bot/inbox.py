"""A durable record of accepted messages that no turn has taken yet.

Channels acknowledge a platform message (advance the Telegram offset, answer the webhook) once
``Dispatcher.submit`` returns; by then the message is in this inbox on disk. When a turn takes it into
the session and the session is saved, the entry is acknowledged and dropped. After a crash or kill,
whatever is still here is fed to the dispatcher again at start-up, so an acknowledged message is never
lost.
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from bot.domain import Attachment, InboundMessage, new_id
from bot.sessions import encode_id
from bot.storage import append_line, atomic_write_text

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class InboxEntry:
    entry_id: str
    message: InboundMessage


class Inbox:
    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._pending: dict[str, list[tuple[str, str]]] = {}  # session id -> [(entry id, json line)]
        self._locks: dict[str, asyncio.Lock] = {}

    def add(self, message: InboundMessage) -> tuple[str, asyncio.Task[None]]:
        """Record ``message``; returns its entry id and the task that makes it durable.

        The entry is registered at once, so arrival order is fixed by the caller's order, not by which
        disk write finishes first; writes and acknowledgements of one session are serialized.
        """
        entry_id = new_id()
        sid = message.session_id
        line = json.dumps({"entry": entry_id, "message": _encode(message)}, ensure_ascii=False)
        self._pending.setdefault(sid, []).append((entry_id, line))
        return entry_id, asyncio.create_task(self._append(sid, line))

    async def _append(self, sid: str, line: str) -> None:
        async with self._lock(sid):
            await asyncio.to_thread(append_line, self._path(sid), line)

    def _lock(self, sid: str) -> asyncio.Lock:
        lock = self._locks.get(sid)
        if lock is None:
            lock = self._locks[sid] = asyncio.Lock()
        return lock

    async def ack(self, sid: str, entry_ids: set[str]) -> None:
        """Drop entries whose messages are now saved in the session."""
        async with self._lock(sid):
            pending = self._pending.get(sid, [])
            remaining = [(e, line) for e, line in pending if e not in entry_ids]
            if len(remaining) == len(pending):
                return
            if remaining:
                self._pending[sid] = remaining
                text = "".join(line + "\n" for _, line in remaining)
                await asyncio.to_thread(atomic_write_text, self._path(sid), text)
            else:
                self._pending.pop(sid, None)
                await asyncio.to_thread(self._path(sid).unlink, missing_ok=True)

    async def load_pending(self) -> list[InboxEntry]:
        """Entries left by a previous run, oldest first per session; unreadable lines are logged."""
        return await asyncio.to_thread(self._load_sync)

    def _load_sync(self) -> list[InboxEntry]:
        entries: list[InboxEntry] = []
        if not self._dir.is_dir():
            return entries
        for path in sorted(self._dir.glob("*.jsonl")):
            try:
                raws = path.read_bytes().splitlines()
            except OSError as exc:
                log.error("inbox_unreadable", path=str(path), error=exc.strerror)
                continue
            for raw in raws:
                if not raw.strip():
                    continue
                try:  # line by line, so one damaged line (bad UTF-8, torn) costs only itself
                    line = raw.decode("utf-8")
                    data = json.loads(line)
                    entry = InboxEntry(str(data["entry"]), _decode(data["message"]))
                except (ValueError, KeyError, TypeError) as exc:
                    log.error("inbox_entry_unreadable", path=str(path), error=str(exc))
                    continue
                entries.append(entry)
                self._pending.setdefault(entry.message.session_id, []).append((entry.entry_id, line))
        return entries

    def _path(self, sid: str) -> Path:
        return self._dir / f"{encode_id(sid)}.jsonl"


def _encode(message: InboundMessage) -> dict[str, Any]:
    return {
        "channel": message.channel,
        "chat_id": message.chat_id,
        "sender_id": message.sender_id,
        "sender_name": message.sender_name,
        "text": message.text,
        "message_id": message.message_id,
        "ts": message.timestamp.isoformat(),
        "is_group": message.is_group,
        "attachments": [
            {
                "kind": a.kind,
                "name": a.name,
                "mime_type": a.mime_type,
                "size": a.size,
                "data": base64.b64encode(a.data).decode("ascii"),
            }
            for a in message.attachments
        ],
    }


def _decode(data: dict[str, Any]) -> InboundMessage:
    return InboundMessage(
        channel=str(data["channel"]),
        chat_id=str(data["chat_id"]),
        sender_id=str(data["sender_id"]),
        text=str(data["text"]),
        sender_name=str(data.get("sender_name") or ""),
        message_id=data.get("message_id"),
        timestamp=datetime.fromisoformat(data["ts"]),
        is_group=bool(data.get("is_group")),
        attachments=tuple(
            Attachment(
                kind=a["kind"],
                name=str(a["name"]),
                mime_type=str(a["mime_type"]),
                size=int(a.get("size", 0)),
                data=base64.b64decode(a.get("data", "")),
            )
            for a in data.get("attachments") or ()
        ),
    )
