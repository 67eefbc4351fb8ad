"""An inbox file read back: its lines decoded, and the entries a damaged line finished.

The lines are those bot/inbox.py appends (its module doc lists them); :func:`encode` is the form a
message takes in an accept line. Reading blocks: the inbox reads its files in a thread, at start-up.

Damaged lines (a torn append) cost only themselves: they are left out, and kept aside as
``<file>.damaged-<hash>`` (``bot/damaged.py``) before a cut or a rewrite could drop them. One that was
a done mark would leave its messages pending, and the next start would send their answer again: a
damaged line still naming a message in a done mark, or followed by a later message's done mark (a
chat's turns run in order), finishes the messages before it (``_done_by_damage`` says exactly when),
and the log says which (``inbox_damaged_done_mark``).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bot import damaged
from bot.domain import Attachment, InboundMessage, parse_time
from bot.outbox import PendingReply
from bot.session_names import encode_id


@dataclass(frozen=True, slots=True)
class InboxEntry:
    entry_id: str
    message: InboundMessage
    accepted_at: datetime


def kept_on_disk(directory: Path) -> dict[str, int]:
    """Answers kept aside per session, as the files in ``directory`` hold them now; reads only, so
    ``membot doctor`` may call it beside a running bot (a line being appended counts as unreadable)."""
    counts: dict[str, int] = {}
    if not directory.is_dir():
        return counts
    for path in sorted(directory.glob("*.jsonl")):
        try:
            kept = read(path).kept
        except OSError:
            continue
        if kept:
            counts[sid(kept)] = len(kept)
    return counts


@dataclass(slots=True)
class _Read:
    """What one journal file says: its pending entries and kept answers, with their lines; its damaged
    lines; and the entries taken as done because of a damaged line (:func:`_done_by_damage`), each with
    why."""

    pending: dict[str, tuple[InboxEntry, str]]
    kept: dict[str, tuple[PendingReply, str]]
    unreadable: list[damaged.DamagedLine]
    lines: int
    taken_as_done: dict[str, str] = field(default_factory=dict)


def read(path: Path) -> _Read:
    raws = list(damaged.lines(path.read_bytes()))
    accepted: dict[str, tuple[InboxEntry, str]] = {}
    order: dict[str, int] = {}  # entry id -> the place (line index) of its accept line
    finished: list[tuple[int, set[str]]] = []  # each done line's place and entries
    replies: dict[str, tuple[PendingReply, str]] = {}
    done: set[str] = set()
    delivered: set[str] = set()
    unreadable: list[tuple[int, damaged.DamagedLine]] = []
    for index, (offset, raw) in enumerate(raws):
        try:  # line by line, so one damaged line (bad UTF-8, torn) costs only itself
            line = raw.rstrip(b"\n").decode("utf-8")
            data = json.loads(line)
            if "done" in data:
                ids = {str(e) for e in data["done"]}
                done.update(ids)
                finished.append((index, ids))
                if data.get("reply"):
                    delivered.add(str(data["reply"]))
            elif "entry" in data:
                message = _decode(data["message"])
                at = parse_time(data["at"]) if "at" in data else message.timestamp
                entry = InboxEntry(str(data["entry"]), message, at)
                accepted.setdefault(entry.entry_id, (entry, line))
                order.setdefault(entry.entry_id, index)
            else:
                reply = PendingReply.from_record(data["reply"])
                replies[reply.id] = (reply, line)
        except damaged.UNREADABLE as exc:
            unreadable.append((index, damaged.DamagedLine(offset, raw, damaged.describe(exc))))
    answered_later = {e for r, (reply, _) in replies.items() if r not in delivered for e in reply.entries}
    taken = _done_by_damage(
        [e for e in accepted if e not in done], order, finished, unreadable, kept=answered_later
    )
    done.update(taken)
    pending = {e: v for e, v in accepted.items() if e not in done}
    kept = {r: v for r, v in replies.items() if r not in delivered and set(v[0].entries) - done}
    return _Read(pending, kept, [d for _, d in unreadable], len(raws), taken)


# How json.dumps begins each kind of line the inbox writes (a key's quotes cannot occur unescaped in a
# string value): what a damaged line was, read from its bytes where the damage left them.
_KINDS = {"done": b'"done": [', "entry": b'"entry": "', "reply": b'"reply": {'}


def _kind(raw: bytes) -> str | None:
    """Which kind of line ``raw`` was (``"done"``, ``"entry"``, ``"reply"``), or ``None`` if its bytes
    no longer tell."""
    kinds = [kind for kind, key in _KINDS.items() if key in raw]
    return kinds[0] if len(kinds) == 1 else None


def _done_by_damage(
    unfinished: list[str],
    order: dict[str, int],
    finished: list[tuple[int, set[str]]],
    unreadable: list[tuple[int, damaged.DamagedLine]],
    *,
    kept: set[str],
) -> dict[str, str]:
    """Of the entries that read as unfinished, those that do only because a damaged line was their done
    mark, each with why: answered again, their chat would get the answer twice. ``order``: the place
    (line index) of each readable accept line; ``finished``: each readable done line's place and ids.

    A damaged line whose bytes still say it was an accept line or a kept answer finished nothing. Any
    other damaged line is taken as the done mark of

    - each unfinished entry whose id its bytes still hold, when they still read as a done line (an id
      is 64 random bits: no other kind of line holds it but the entry's accept line and kept answer);
    - each unfinished entry accepted before it, when a readable done line after it finishes an entry
      accepted later: a chat's turns run one at a time, in arrival order (bot/dispatcher), so that
      later message was finished after the earlier one's turn had ended, and the likeliest line to
      have stood between is the earlier one's done mark. (The only other ways an earlier message stays
      pending past a later one's answer are an answer kept unsent, the platform refusing it, and a
      turn that crashed on a bug; with a damaged line of unknown kind between them, such a message is
      taken as finished too: the log names it, and the damaged bytes are kept aside.) Not one in
      ``kept``, whose answer is kept unsent in the file: it stays pending by design, and taking it as
      done would drop an answer the user never got.

    An unfinished entry with no damaged line after it, or none that a later finished entry follows (a
    torn append at the end, or only pending messages after it), stays pending and is answered.
    """
    taken: dict[str, str] = {}
    for place, line in unreadable:
        kind = _kind(line.data)
        if kind in ("entry", "reply"):
            continue
        later = [order[e] for at, ids in finished if at > place for e in ids if e in order]
        for entry_id in unfinished:
            accepted = order[entry_id]
            if entry_id in taken or accepted > place:
                continue
            if kind == "done" and entry_id.encode() in line.data:
                taken[entry_id] = f"the damaged line at byte {line.offset} still names it in a done mark"
            elif entry_id not in kept and any(at > accepted for at in later):
                taken[entry_id] = (
                    f"a later message was finished after the damaged line at byte {line.offset}, "
                    "and a chat's turns run in order"
                )
    return taken


def sid(replies: dict[str, tuple[PendingReply, str]]) -> str:
    return next(iter(replies.values()))[0].session_id


def path_of(directory: Path, session_id: str) -> Path:
    """The inbox file of a chat in the inbox ``directory``."""
    return directory / f"{encode_id(session_id)}.jsonl"


def entry_line(entry: InboxEntry) -> str:
    """The accept line of ``entry`` (without its line end)."""
    record = {"entry": entry.entry_id, "at": entry.accepted_at.isoformat(), "message": encode(entry.message)}
    return json.dumps(record, ensure_ascii=False)


def reply_line(reply: PendingReply) -> str:
    """The line that keeps an unsent answer (without its line end)."""
    return json.dumps({"reply": reply.to_record()}, ensure_ascii=False)


def encode(message: InboundMessage) -> dict[str, Any]:
    return {
        "channel": message.channel,
        "chat_id": message.chat_id,
        "sender_id": message.sender_id,
        "sender_name": message.sender_name,
        "text": message.text,
        "message_id": message.message_id,
        "ts": message.timestamp.isoformat(),
        "is_group": message.is_group,
        **({"joined": list(message.joined)} if message.joined else {}),
        **({"platform_date": True} if message.platform_date else {}),
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
        timestamp=parse_time(data["ts"]),
        is_group=bool(data.get("is_group")),
        joined=tuple(str(i) for i in data.get("joined") or ()),
        platform_date=bool(data.get("platform_date")),
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
