"""Sessions on disk (the in-memory cache in front of them: ``bot/session_service.py``).

Layout under ``sessions/``, for a session id encoded to ``<name>`` (``bot/session_names.py``):

- ``<name>.<generation>.jsonl``: the message log. A save appends one group of lines (the new
  messages, answers waiting to be sent, and a ``state`` record with usage and metadata that commits
  the group; see ``bot/session_log.py``) with one fsync, so its cost does not grow with the
  conversation. A rewrite (the first save, compaction, /new) writes a new generation atomically.
- ``<name>.json``: the header (id, state, usage, metadata, timestamps) naming the current log
  generation and its length at the rewrite. Replaced atomically, and only when the log is rewritten:
  what changes on an ordinary turn travels in the log's state records.

What a load finds wrong (a save a crash cut short, a damaged line or header, a header naming a log a
copy did not take) is set aside and mended by ``bot/session_repair.py``, so one bad file never takes
the service down; this store decides when, and a ``read_only`` one never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

import structlog

from bot import session_repair
from bot.damaged import UNREADABLE, UNREADABLE_FILE, corrupt_path, describe
from bot.domain import Session, parse_time
from bot.errors import StorageError
from bot.outbox import PendingReply
from bot.session_log import (
    HEADER_VERSION,
    LogContent,
    apply_state,
    encode_group,
    header_fields,
    read_log,
    session_from_header,
)
from bot.session_names import encode_id, glob_escape, header_file, log_file
from bot.storage import append_bytes, atomic_write_bytes, ensure_private_dir, refuse_newer
from bot.surrogates import utf8

log = structlog.get_logger(__name__)

_MEANWHILE = "the chat's messages wait for it, as for a full disk"  # a newer membot's header (refuse_newer)


class SessionStore(Protocol):
    """Where sessions live. JSON files now; a shared store for several instances can replace it."""

    async def load(self, sid: str) -> Session | None: ...

    async def save(self, session: Session, *, replies: Sequence[PendingReply] = ()) -> None: ...

    async def replies(self, sid: str) -> list[PendingReply]: ...

    async def delete(self, sid: str) -> bool: ...

    async def list_ids(self) -> list[str]: ...

    async def changed_since(self, when: datetime) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class _SavePlan:
    rewrite: bool
    data: bytes
    header: bytes | None  # written only with a rewrite; encoded on the loop, as ``data`` is
    generation: int
    log_bytes: int
    count: int


@dataclass(frozen=True, slots=True)
class SessionPeek:
    """A session's id, size and last activity, for listings (``membot sessions list``)."""

    id: str
    messages: int
    updated_at: datetime | None


READ_TRIES = 5  # a read-only load's tries when the bot keeps replacing the session's log under it


class _LogReplaced(Exception):
    """The log a header named was gone when read: the session was rewritten in between."""


class JsonSessionStore:
    """Sessions as a header JSON plus an append-only JSON-lines message log (see the module doc).

    ``read_only``: for a reader beside a running bot (``membot sessions show|export``). Its loads
    change nothing on disk: no file moved aside, no header rebuilt, no damaged line set aside (those
    are the owner's to do, at its next load); a damaged session is a :class:`StorageError` instead. A
    log the bot replaced between the reads of the header and of the log (a rewrite: the first save,
    compaction, /new) is looked up again from the new header. A reader that repaired instead would
    move a live session's files aside in that gap, and the bot's next save would start a log no
    header names.
    """

    def __init__(self, directory: Path, *, read_only: bool = False) -> None:
        self._dir = directory
        self._read_only = read_only

    @property
    def directory(self) -> Path:
        return self._dir

    def header_path(self, sid: str) -> Path:
        return header_file(self._dir, sid)

    def _log_path(self, sid: str, generation: int) -> Path:
        return log_file(self._dir, sid, generation)

    # -- load -------------------------------------------------------------------------------------

    async def load(self, sid: str) -> Session | None:
        return await asyncio.to_thread(self._load_sync, sid)

    def _load_sync(self, sid: str) -> Session | None:
        if not self._read_only:
            return self._load_once(sid)
        for _ in range(READ_TRIES):
            try:
                return self._load_once(sid)
            except _LogReplaced:
                continue  # the bot rewrote the session meanwhile: its new header names the new log
        raise StorageError(
            f"session {sid} names a log that is missing: either it kept changing while it was read (try "
            "again), or this is a copy taken while the bot ran, whose header and logs are of different "
            "moments (the bot rebuilds the header from the log it has when it next loads the chat)"
        )

    def _load_once(self, sid: str, *, rebuilt: bool = False) -> Session | None:
        header_path = self.header_path(sid)
        try:
            raw = header_path.read_bytes()
        except FileNotFoundError:
            return None
        except IsADirectoryError as exc:
            if self._read_only:
                raise StorageError(f"cannot read session file {header_path}: {exc.strerror}") from exc
            # A folder where the header belongs never becomes readable by itself (as EIO may): every turn
            # of the chat failed on it. It is kept aside, and the header rebuilt as a damaged one is.
            moved = corrupt_path(header_path)
            os.replace(header_path, moved)
            log.error("session_header_is_a_folder", session_id=sid, moved_to=moved.name)
            raw = b""
        except OSError as exc:
            raise StorageError(f"cannot read session file {header_path}: {exc.strerror}") from exc
        try:
            header = json.loads(raw)
            if not isinstance(header, dict):
                raise ValueError("session header is not a JSON object")
            # A rollback: read as this version's, its fields unknown here would be dropped at the next
            # rewrite, and its log read by rules it may not follow. The chat waits, as for a full disk.
            refuse_newer(header, HEADER_VERSION, path=header_path, what="session file", meanwhile=_MEANWHILE)
            session_from_header(header)
        except UNREADABLE as exc:
            if self._read_only:
                raise StorageError(
                    f"session file {header_path} is damaged ({describe(exc)}): the bot rebuilds it from"
                    " its log when it next loads the session (start it, or let it answer in that chat)"
                ) from exc
            header = session_repair.rebuild_header(self._dir, sid, raw, reason=describe(exc))
            if header is None:
                session_repair.move_aside(self._dir, sid, header_path, reason=describe(exc))
                return None
        try:
            if header.get("id") != sid:
                raise ValueError(f"file belongs to session {header.get('id')!r}")
            session = session_from_header(header)
            content = self._read_log(sid, session)
            session.messages = content.messages
            if content.state is not None:
                apply_state(session, content.state)
            session.log_bytes = content.end
        except FileNotFoundError as exc:
            if self._read_only:
                raise _LogReplaced from exc
            # No rewrite runs beside this process (it holds the workspace): the header and the logs were
            # copied at different moments (a backup of a running bot), one before a rewrite and one
            # after. The log the copy has holds the session up to its last save and stands in for it.
            reason = f"the log it names is missing ({Path(str(exc.filename)).name})"
            if not rebuilt and session_repair.rebuild_header(self._dir, sid, raw, reason=reason) is not None:
                return self._load_once(sid, rebuilt=True)
            session_repair.move_aside(self._dir, sid, header_path, reason=f"{type(exc).__name__}: {exc}")
            return None
        except UNREADABLE_FILE as exc:
            if self._read_only:
                raise StorageError(f"session {sid} cannot be read ({type(exc).__name__}: {exc})") from exc
            session_repair.move_aside(self._dir, sid, header_path, reason=f"{type(exc).__name__}: {exc}")
            return None
        if not self._read_only:
            if content.damaged or content.unfinished:
                session_repair.keep_unread(self._dir, sid, session, content)
            session_repair.drop_old_logs(self._dir, sid, session.log_generation)
        session.persisted_count = len(session.messages)
        return session

    def _read_log(self, sid: str, session: Session) -> LogContent:
        if session.log_generation == 0:
            return LogContent()
        data = self._log_path(sid, session.log_generation).read_bytes()
        return read_log(data, committed=session.log_bytes)

    async def replies(self, sid: str) -> list[PendingReply]:
        """The answers saved in the session's current log, oldest first (recovery sends the unsent ones)."""
        return await asyncio.to_thread(self._replies_sync, sid)

    def _replies_sync(self, sid: str) -> list[PendingReply]:
        try:
            header = json.loads(self.header_path(sid).read_bytes())
            content = self._read_log(sid, session_from_header(header))
        except FileNotFoundError:
            return []
        except UNREADABLE_FILE as exc:
            log.error("session_replies_unreadable", session_id=sid, error=f"{type(exc).__name__}: {exc}")
            return []
        return list(content.replies.values())

    def peek(self, header_path: Path) -> SessionPeek | None:
        """Id, message count and last activity of the session whose header is ``header_path``, reading
        only the part of its log written since the last rewrite; ``None`` if it cannot be read."""
        try:
            header = json.loads(header_path.read_bytes())
            session = session_from_header(header)
            count, updated = int(header.get("log_count", 0)), session.updated_at
            if session.log_generation:
                with self._log_path(session.id, session.log_generation).open("rb") as f:
                    f.seek(session.log_bytes)
                    tail = read_log(f.read(), committed=0)
                count += len(tail.messages)
                if tail.state is not None and tail.state.get("updated_at"):
                    updated = parse_time(tail.state["updated_at"])
        except UNREADABLE_FILE:
            return None
        return SessionPeek(session.id, count, updated)

    # -- save -------------------------------------------------------------------------------------

    async def save(self, session: Session, *, replies: Sequence[PendingReply] = ()) -> None:
        """Persist what changed since the last save, with ``replies`` (answers about to be sent) in the
        same group: one append and one fsync, or a rewrite when older messages changed."""
        plan = self._plan(session, replies)
        # The plan holds the metadata as it is now; a note made while it is written is the next save's.
        changed, session.metadata_changed = session.metadata_changed, False
        try:
            await asyncio.to_thread(self._write, session.id, plan, session.log_generation, session.log_bytes)
        except BaseException:
            session.metadata_changed |= changed
            raise
        session.log_generation = plan.generation
        session.log_bytes = plan.log_bytes
        session.persisted_count = plan.count
        session.rewrite_needed = False

    def _plan(self, session: Session, replies: Sequence[PendingReply]) -> _SavePlan:
        """Snapshot what must be written (on the loop, so the session may change right after)."""
        rewrite = (
            session.rewrite_needed
            or session.log_generation == 0
            or session.persisted_count > len(session.messages)
        )
        start = 0 if rewrite else session.persisted_count
        data = encode_group(session.messages[start:], replies, session.summary())
        count = len(session.messages)
        if not rewrite:
            return _SavePlan(False, data, None, session.log_generation, session.log_bytes + len(data), count)
        generation = session.log_generation + 1
        header = header_fields(session, generation=generation, count=count, log_bytes=len(data))
        return _SavePlan(
            True, data, utf8(json.dumps(header, ensure_ascii=False)), generation, len(data), count
        )

    def _write(self, sid: str, plan: _SavePlan, old_generation: int, old_bytes: int) -> None:
        ensure_private_dir(self._dir)
        try:
            if plan.header is None:
                append_bytes(self._log_path(sid, plan.generation), plan.data, truncate_to=old_bytes)
            else:
                atomic_write_bytes(self._log_path(sid, plan.generation), plan.data)
                atomic_write_bytes(self.header_path(sid), plan.header)
        except OSError as exc:
            raise StorageError(f"cannot save session {sid!r} under {self._dir}: {exc.strerror}") from exc
        if plan.rewrite and old_generation and old_generation != plan.generation:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._log_path(sid, old_generation))

    # -- delete / list ----------------------------------------------------------------------------

    async def delete(self, sid: str) -> bool:
        return await asyncio.to_thread(self._delete_sync, sid)

    def _delete_sync(self, sid: str) -> bool:
        header = self.header_path(sid)
        existed = header.exists()
        prefix = encode_id(sid) + "."
        for path in self._dir.glob(f"{glob_escape(encode_id(sid))}.*"):
            rest = path.name[len(prefix) :]
            if path == header or (rest.endswith(".jsonl") and rest[: -len(".jsonl")].isdigit()):
                path.unlink(missing_ok=True)
        return existed

    async def list_ids(self) -> list[str]:
        return await asyncio.to_thread(self._list_sync)

    def _list_sync(self) -> list[str]:
        return self._ids_of(sorted(self._dir.glob("*.json")) if self._dir.is_dir() else [])

    async def changed_since(self, when: datetime) -> list[str]:
        """The sessions whose files were written at or after ``when`` (by their modification time)."""
        return await asyncio.to_thread(self._changed_sync, when.timestamp())

    def _changed_sync(self, since: float) -> list[str]:
        headers: set[Path] = set()
        for path in self._dir.glob("*.json*") if self._dir.is_dir() else []:
            name = path.name  # <id>.json (header) or <id>.<generation>.jsonl (log); ids may hold dots
            if name.endswith(".jsonl"):
                base = name.removesuffix(".jsonl").rsplit(".", 1)[0]
            elif name.endswith(".json"):
                base = name.removesuffix(".json")
            else:
                continue
            with contextlib.suppress(OSError):
                if path.stat().st_mtime >= since:
                    headers.add(self._dir / f"{base}.json")
        return self._ids_of(sorted(headers))

    @staticmethod
    def _ids_of(headers: Iterable[Path]) -> list[str]:
        ids: list[str] = []
        for path in headers:
            try:
                ids.append(str(json.loads(path.read_bytes())["id"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return ids
