"""A session's on-disk format: the header's fields, and the log where each save appends a group.

A save writes one *group* of JSON lines with a single append and fsync: the new messages, the answers
waiting to be sent (:class:`~bot.outbox.PendingReply`) and last a ``state`` record carrying the
session's header fields (usage, metadata, timestamps). The state record is the group's commit point:

- every complete group is part of the session, so the header file (``<name>.json``) needs replacing
  only when the log itself is rewritten (the first save, compaction, /new), not on every turn;
- a group cut short by a crash (no state record after it) is not part of the session; the loader
  stops before it and the next append cuts it off;
- a damaged line followed by a committed group (or before the header's ``log_bytes``) is not a torn
  append but damage: it is left out and reported, every other line is kept, and the store sets its
  bytes aside (``bot/damaged.py``). A line that is valid JSON but not a record it can read (an unknown
  role, a reply naming a lost message, a state record with a bad time) is damage of the same kind.

Lines up to the header's ``log_bytes`` (the last rewrite) are committed whatever they hold, which also
reads logs written before state records existed (their header was replaced on every save).

    data = encode_group(new_messages, [reply], session.summary())
    content = read_log(path.read_bytes(), committed=header["log_bytes"])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bot.damaged import UNREADABLE, DamagedLine, describe
from bot.domain import Message, Role, Session, SessionState, Usage, parse_time
from bot.outbox import RECORD as REPLY_RECORD
from bot.outbox import PendingReply
from bot.surrogates import utf8

STATE_RECORD = "state"
HEADER_VERSION = 1


@dataclass(slots=True)
class LogContent:
    """What a log holds: the committed messages, replies and last state, and where the commits end.

    ``damaged`` are the lines that could not be read among committed ones (each costs only itself);
    ``unfinished`` is what follows the last commit (a save a crash cut short), cut off by the next append.
    """

    messages: list[Message] = field(default_factory=list)
    replies: dict[str, PendingReply] = field(default_factory=dict)
    state: dict[str, Any] | None = None
    end: int = 0  # bytes up to the end of the last committed group: the next append starts here
    damaged: list[DamagedLine] = field(default_factory=list)
    unfinished: bytes = b""
    _texts: dict[str, str] = field(default_factory=dict)

    def _apply(self, group: list[tuple[int, bytes, dict[str, Any]]]) -> None:
        for offset, raw, record in group:
            try:
                self._apply_record(record)
            except UNREADABLE as exc:  # valid JSON, but not a record membot can use: only it is lost
                self.damaged.append(DamagedLine(offset, raw, describe(exc)))

    def _apply_record(self, record: dict[str, Any]) -> None:
        kind = record.get("record")
        if kind is None:
            message = Message.from_dict(record)
            self.messages.append(message)
            self._texts[message.id] = message.content
        elif kind == REPLY_RECORD:
            reply = PendingReply.from_record(record, texts=self._texts)
            self.replies[reply.id] = reply
        elif kind == STATE_RECORD:
            state = record["session"]
            if not isinstance(state, dict):
                raise ValueError("a state record without a session object")
            _State.parse(state)  # checked now, so applying it later cannot fail
            self.state = state
        # another kind comes from a newer membot: skipped, so downgrading keeps the messages


def encode_group(
    messages: Sequence[Message], replies: Sequence[PendingReply], state: dict[str, Any]
) -> bytes:
    """One save's lines. A reply whose text is an assistant message of this group points at it."""
    lines = [_dump(m.to_dict()) for m in messages]
    texts = {m.content: m.id for m in messages if m.role is Role.ASSISTANT and m.content}
    lines += [_dump(r.to_record(text_of=texts.get(r.text))) for r in replies]
    lines.append(_dump({"record": STATE_RECORD, "session": state}))
    return b"".join(line + b"\n" for line in lines)


def read_log(data: bytes, *, committed: int) -> LogContent:
    """Parse a log; ``committed`` bytes (the header's ``log_bytes``) were whole when written.

    A damaged line among committed ones (before ``committed``, or followed by a complete group) is left
    out and listed in ``damaged``: it costs only itself. What follows the last commit is ``unfinished``.
    Raises ``ValueError`` only when the log is shorter than ``committed`` (bytes of it are gone).
    """
    if len(data) < committed:
        raise ValueError(f"the message log is shorter ({len(data)} bytes) than its header says ({committed})")
    content = LogContent()
    group: list[tuple[int, bytes, dict[str, Any]]] = []
    pos = 0
    while pos < len(data):
        newline = data.find(b"\n", pos)
        end = len(data) if newline < 0 else newline + 1
        raw = data[pos:end]
        if raw.strip():
            try:
                if newline < 0:
                    raise ValueError("unfinished line")
                record = json.loads(raw)
                if not isinstance(record, dict):
                    raise ValueError("a line that is not a JSON object")
            except ValueError as exc:
                if not (end <= committed or _commit_after(data, end)):
                    break  # a group cut short by a crash: not part of the session
                content.damaged.append(DamagedLine(pos, raw, describe(exc)))
            else:
                group.append((pos, raw, record))
        if end == committed or (group and group[-1][2].get("record") == STATE_RECORD and end > committed):
            content._apply(group)
            content.end = end
            group = []
        pos = end
    if data[content.end :].strip():
        content.unfinished = data[content.end :]
    return content


def _commit_after(data: bytes, start: int) -> bool:
    """Whether a complete state record follows ``start`` (then a bad line before it is damage)."""
    for raw in data[start:].split(b"\n")[:-1]:
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("record") == STATE_RECORD:
            return True
    return False


def _dump(data: dict[str, Any]) -> bytes:
    return utf8(json.dumps(data, ensure_ascii=False, separators=(",", ":")))


def header_fields(session: Session, *, generation: int, count: int, log_bytes: int) -> dict[str, Any]:
    """The header file's content: the session's fields and the log it names, as of a rewrite."""
    return {
        "version": HEADER_VERSION,
        **session.summary(),
        "log_generation": generation,
        "log_count": count,
        "log_bytes": log_bytes,
    }


def session_from_header(header: dict[str, Any]) -> Session:
    """The session a header describes, without its messages (they are in the log)."""
    session = Session(
        id=str(header["id"]),
        channel=str(header["channel"]),
        chat_id=str(header["chat_id"]),
        created_at=parse_time(header["created_at"]),
        log_generation=int(header.get("log_generation", 0)),
        log_bytes=int(header.get("log_bytes", 0)),
    )
    apply_state(session, header)
    return session


@dataclass(frozen=True, slots=True)
class _State:
    """What a save may change about a session, read from a state record or the header, and checked."""

    metadata: dict[str, Any]
    state: SessionState
    updated_at: datetime
    usage: Usage
    compactions: int

    @classmethod
    def parse(cls, data: dict[str, Any]) -> _State:
        return cls(
            metadata=dict(data.get("metadata") or {}),
            state=SessionState(data.get("state", "active")),
            updated_at=parse_time(data["updated_at"]),
            usage=Usage.from_dict(data.get("usage") or {}),
            compactions=int(data.get("compactions", 0)),
        )


def apply_state(session: Session, state: dict[str, Any]) -> None:
    """Set what a save may change (a state record of the log, or the header) on ``session``."""
    parsed = _State.parse(state)
    session.metadata = parsed.metadata
    session.state = parsed.state
    session.updated_at = parsed.updated_at
    session.usage = parsed.usage
    session.compactions = parsed.compactions
