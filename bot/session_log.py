"""A session's on-disk format: the header's fields, and the log where each save appends a group.

A save writes one *group* of JSON lines with a single append and fsync: the new messages, the answers
waiting to be sent (:class:`~bot.outbox.PendingReply`) and last a ``state`` record carrying the
session's header fields (usage, metadata, timestamps). The state record is the group's commit point:

- every complete group is part of the session, so the header file (``<name>.json``) needs replacing
  only when the log itself is rewritten (the first save, compaction, /new), not on every turn;
- a group cut short by a crash (no state record after it) is not part of the session; the loader
  stops before it and the next append cuts it off;
- a damaged line followed by a committed group is not a torn append but damage, and is reported so
  the store can move the files aside rather than silently drop what follows.

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

from bot.domain import Message, Role, Session, SessionState, Usage
from bot.outbox import RECORD as REPLY_RECORD
from bot.outbox import PendingReply
from bot.surrogates import utf8

STATE_RECORD = "state"
HEADER_VERSION = 1


@dataclass(slots=True)
class LogContent:
    """What a log holds: the committed messages, replies and last state, and where the commits end."""

    messages: list[Message] = field(default_factory=list)
    replies: dict[str, PendingReply] = field(default_factory=dict)
    state: dict[str, Any] | None = None
    end: int = 0  # bytes up to the end of the last committed group: the next append starts here
    _texts: dict[str, str] = field(default_factory=dict)

    def _apply(self, group: list[dict[str, Any]]) -> None:
        for record in group:
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
    """Parse a log; ``committed`` bytes (the header's ``log_bytes``) must be whole and valid.

    Raises ``ValueError`` (or ``KeyError``/``TypeError`` from a malformed message) on damage.
    """
    if len(data) < committed:
        raise ValueError(f"the message log is shorter ({len(data)} bytes) than its header says ({committed})")
    content = LogContent()
    group: list[dict[str, Any]] = []
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
                if end <= committed or _commit_after(data, end):
                    raise ValueError(f"damaged line at byte {pos} of the message log: {exc}") from None
                break  # a group cut short by a crash: not part of the session
            group.append(record)
        if end == committed or (group and group[-1].get("record") == STATE_RECORD and end > committed):
            content._apply(group)
            content.end = end
            group = []
        pos = end
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
        created_at=datetime.fromisoformat(header["created_at"]),
        log_generation=int(header.get("log_generation", 0)),
        log_bytes=int(header.get("log_bytes", 0)),
    )
    apply_state(session, header)
    return session


def apply_state(session: Session, state: dict[str, Any]) -> None:
    """Set what a save may change (a state record of the log, or the header) on ``session``."""
    session.metadata = dict(state.get("metadata") or {})
    session.state = SessionState(state.get("state", "active"))
    session.updated_at = datetime.fromisoformat(state["updated_at"])
    session.usage = Usage.from_dict(state.get("usage") or {})
    session.compactions = int(state.get("compactions", 0))
