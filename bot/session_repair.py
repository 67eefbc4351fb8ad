"""What a session's load does with what a crash, a kill or a copy left behind (the store: bot/sessions.py).

A crash during an append leaves a group without its state record; it is not part of the session, and
the next append cuts it off. A damaged line costs only itself: the session keeps every other line and
the next save rewrites the log without it. Both are first set aside, as ``<log>.damaged-<hash>``
(``bot/damaged.py``), and logged (:func:`keep_unread`). A damaged header is rebuilt from the newest log
(its state records hold the same fields) and kept aside the same way, as is one naming a log that is
missing (a copy of a running bot took the header and the logs on either side of a rewrite;
:func:`rebuild_header`). A header no log can stand in for, one naming another session, or a log shorter
than its header says, is moved aside as ``*.corrupt-<timestamp>`` (:func:`move_aside`) and a fresh
session starts, so one bad file never takes the service down. A log older than the header's, which a
kill during a rewrite left, is deleted (:func:`drop_old_logs`).

Only the owner's load repairs (never a ``read_only`` store beside a running bot): the store decides
when, these functions how.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import structlog

from bot.damaged import UNREADABLE_FILE, DamagedLine, keep_aside
from bot.domain import Session, utcnow
from bot.errors import StorageError
from bot.session_log import LogContent, header_fields, read_log, session_from_header
from bot.session_names import encode_id, glob_escape, header_file, log_file
from bot.storage import atomic_write_bytes
from bot.surrogates import utf8

log = structlog.get_logger(__name__)


def drop_old_logs(directory: Path, sid: str, current: int) -> None:
    """Delete the logs older than the ``current`` generation the header names: a kill between a
    rewrite's header rename and the unlink of the old log left it (nothing reads it any more). A
    newer one (a kill before the rename) is left: the next rewrite writes that generation anew."""
    name = encode_id(sid)
    for path in directory.glob(f"{glob_escape(name)}.*.jsonl"):
        number = path.name[len(name) + 1 : -len(".jsonl")]
        if number.isdigit() and int(number) < current:
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:  # only disk space is at stake: the next load tries again
                log.warning("session_old_log_not_deleted", session_id=sid, path=str(path), error=str(exc))
                continue
            log.info("session_old_log_deleted", session_id=sid, generation=int(number))


def rebuild_header(directory: Path, sid: str, raw: bytes, *, reason: str) -> dict[str, Any] | None:
    """Rebuild a damaged header from its newest log, whose state records hold the same fields, and
    write it (the damaged one kept aside); ``None`` when no log can stand in for it."""
    name = encode_id(sid)
    generations = [
        int(number)
        for path in directory.glob(f"{glob_escape(name)}.*.jsonl")
        if (number := path.name[len(name) + 1 : -len(".jsonl")]).isdigit()
    ]
    if not generations:
        return None
    generation = max(generations)
    try:
        content = read_log(log_file(directory, sid, generation).read_bytes(), committed=0)
        if content.state is None or content.state.get("id") != sid:
            return None  # a log written before state records, or not this session's
        session = session_from_header({**content.state, "log_generation": generation})
    except UNREADABLE_FILE:
        return None
    header = header_fields(session, generation=generation, count=len(content.messages), log_bytes=0)
    kept = keep_aside(
        header_file(directory, sid),
        [DamagedLine(0, raw, reason)],
        event="session_header_rebuilt",
        session_id=sid,
    )
    if kept is None:
        return None
    atomic_write_bytes(header_file(directory, sid), utf8(json.dumps(header, ensure_ascii=False)))
    return header


def keep_unread(directory: Path, sid: str, session: Session, content: LogContent) -> None:
    """Set aside what the log holds beyond the session, before a save can drop it: damaged lines (the
    next save rewrites the log without them) and a save a crash cut short (the next append cuts it
    off; its messages are still pending in the inbox, so they are answered and saved again)."""
    path = log_file(directory, sid, session.log_generation)
    unread = list(content.damaged)
    if content.unfinished:
        unread.append(DamagedLine(content.end, content.unfinished, "a save cut short (no state record)"))
    event = "session_log_lines_set_aside" if content.damaged else "session_log_unfinished_save_set_aside"
    if keep_aside(path, unread, event=event, session_id=sid, messages_kept=len(content.messages)) is None:
        raise StorageError(f"cannot set aside the unreadable lines of {path}: fix the disk, then retry")
    if content.damaged:
        session.rewrite_needed = True


def move_aside(directory: Path, sid: str, header_path: Path, *, reason: str) -> None:
    """Move the session's header and logs aside as ``*.corrupt-<timestamp>``: the chat starts afresh,
    and the files stay for the operator to read (files already set aside are not the session's)."""
    stamp = utcnow().strftime("%Y%m%dT%H%M%S%f")
    moved = []
    prefix = encode_id(sid) + "."
    for path in list(directory.glob(f"{glob_escape(encode_id(sid))}.*")):
        rest = path.name[len(prefix) :]
        if path == header_path or (rest.endswith(".jsonl") and rest[: -len(".jsonl")].isdigit()):
            target = path.with_name(f"{path.name}.corrupt-{stamp}")
            os.replace(path, target)
            moved.append(target.name)
    log.error("session_file_corrupt", session_id=sid, reason=reason, moved_to=moved)
