"""The inbox: a durable journal of accepted messages, kept until each one's answer was delivered.

Channels acknowledge a platform message (advance the Telegram offset, answer the webhook) once
``Dispatcher.submit`` returns; by then its *accept* line is on disk here. The entry stays pending while
the turn runs, while its answer is saved and sent, and is marked *done* only once the channel
confirmed the send (or the user stopped the turn, or a stale message was acknowledged as skipped). So
a kill at any point, even mid-turn, leaves the message pending, and the next start answers it.

One file per session, ``inbox/<session>.jsonl``, appended durably through one :class:`GroupWriter`
(the lines queued meanwhile, of every session, share a write and an fsync per file; a done mark never
waits behind a burst of arrivals one fsync at a time, which widened the window in which a kill makes
the next start send an answer again):

- ``{"entry": id, "at": accepted, "message": {...}}``: accepted (a message, or a command the chat was
  told waits for its running turn, /new or /compact: bot/dispatcher/commands.py);
- ``{"done": [ids], "reply": id | null}``: finished;
- ``{"reply": {...}}``: an answer whose send failed for good, kept for the next start (bot/outbox.py).

A kept answer older than ``dispatcher.kept_reply_max_age`` (its chat refused the bot for weeks) is not
tried again: :meth:`Inbox.expire` moves it to ``inbox/expired/<session>.jsonl``, where the operator can
still find it, and marks its entries done, so the file can be cut and no start asks the platform again.

When nothing of a session is pending any more the file is cut to zero length without an fsync: should
the cut be lost in a crash, the accept lines come back together with their done lines, so nothing is
answered twice. A file that has gathered many finished lines while something is still pending (a chat
that never pauses) is rewritten atomically with only what is pending. A file the start could not read
(EIO) is neither cut nor rewritten in that run: what it holds is left for a start that reads it. A
folder in a file's place never becomes readable by itself and refused every message of its chat, for
good: it is moved aside (``<file>.corrupt-<time>``), at the start or when a write finds it, and the file
written anew with what the chat has pending (``inbox_file_is_a_folder`` in the log).
Damaged lines (a torn append) cost only themselves: they are left out, and kept aside as
``<file>.damaged-<hash>`` (``bot/damaged.py``) before a cut or a rewrite could drop them. One that was
a done mark would leave its messages pending, and the next start would send their answer again: a
damaged line still naming a message in a done mark, or followed by a later message's done mark (a
chat's turns run in order), finishes the messages before it (``_done_by_damage`` says exactly when),
and the log says which (``inbox_damaged_done_mark``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from bot import damaged
from bot.domain import Attachment, InboundMessage, new_id, parse_time, utcnow
from bot.group_writer import GroupWriter
from bot.outbox import PendingReply
from bot.sessions import encode_id
from bot.storage import atomic_write_text, line_bytes

log = structlog.get_logger(__name__)

COMPACT_AFTER = 64  # finished lines a file may gather while something is pending, before a rewrite
EXPIRED = "expired"  # the folder, inside the inbox's, of kept answers too old to send (see the module doc)


@dataclass(frozen=True, slots=True)
class InboxEntry:
    entry_id: str
    message: InboundMessage
    accepted_at: datetime


@dataclass(slots=True)
class _Journal:
    """What one session's file holds, in memory."""

    pending: dict[str, tuple[InboxEntry, str]] = field(default_factory=dict)  # id -> (entry, its line)
    replies: dict[str, tuple[PendingReply, str]] = field(default_factory=dict)  # failed sends
    finished_lines: int = 0
    refilled: set[str] = field(default_factory=set)  # entries the file was last written anew with


class Inbox:
    """See the module doc. Call :meth:`load_pending` once at start-up, before messages arrive."""

    def __init__(self, directory: Path, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._dir = directory
        self._clock = clock
        self._journals: dict[str, _Journal] = {}
        self._loaded = False
        self._unread: set[Path] = set()  # files the start could not read: never cut nor rewritten
        self._writer = GroupWriter("inbox-writer")

    def add(self, message: InboundMessage) -> tuple[str, asyncio.Task[None]]:
        """Record ``message``; returns its entry id and the task that makes it durable.

        The entry is registered and its line queued at once, so arrival order (in memory and on disk)
        is the caller's order, not the order in which writes finish.
        """
        entry = InboxEntry(new_id(), message, self._clock())
        line = json.dumps(
            {"entry": entry.entry_id, "at": entry.accepted_at.isoformat(), "message": _encode(message)},
            ensure_ascii=False,
        )
        journal = self._journal(message.session_id)
        journal.pending[entry.entry_id] = (entry, line)
        path = self._path(message.session_id)
        durable = self._writer.submit(path, line_bytes(line))
        return entry.entry_id, asyncio.create_task(self._add(path, journal, entry.entry_id, durable))

    async def _add(self, path: Path, journal: _Journal, entry_id: str, durable: asyncio.Future[None]) -> None:
        """Wait for an entry's write; one that could not be written is forgotten (the caller raises, the
        channel does not confirm the message, and its redelivery is taken as new, not as a duplicate).
        One refused by a folder in the file's place is on disk once the file is written anew with it."""
        try:
            await durable
        except IsADirectoryError:
            held = False
            try:
                held = entry_id in await self._replace_folder(path, journal)
            finally:
                if not held:
                    journal.pending.pop(entry_id, None)
            if not held:
                raise
        except BaseException:
            journal.pending.pop(entry_id, None)
            raise

    async def _append(self, path: Path, journal: _Journal, data: bytes) -> None:
        """Append ``data`` to a chat's file durably, writing the file anew first should a folder stand
        in its place (:meth:`_replace_folder`)."""
        try:
            await self._writer.append(path, data)
        except IsADirectoryError:
            await self._replace_folder(path, journal)
            await self._writer.append(path, data)

    async def _replace_folder(self, path: Path, journal: _Journal) -> set[str]:
        """A folder where a chat's file belongs (made by hand, a restore gone wrong) refuses every append
        for good, and held the chat as a full disk does, forever: it is moved aside, kept for the
        operator as ``<file>.corrupt-<time>`` (``damaged.corrupt_path``), and the file written anew
        with what the chat has pending (its lines were in the file the folder replaced). Returns the
        entries the file was last written anew with (by this call, or one just before it)."""
        pending = list(journal.pending)
        lines = [line for _, line in journal.pending.values()] + [
            line for _, line in journal.replies.values()
        ]
        text = "".join(f"{line}\n" for line in lines)

        def replace() -> bool:
            if not path.is_dir():
                return False  # (another write's call just did it)
            _move_folder(path, written_anew_with=len(pending))
            atomic_write_text(path, text)
            return True

        # A barrier: the calls of every write the folder refused settle in order, the first one's
        # continuation (which notes the entries) before the next one's.
        if await self._writer.call(replace):
            journal.refilled = set(pending)
        return journal.refilled

    def holds(self, sid: str, message_id: str) -> bool:
        """Whether a pending entry of ``sid`` is (or joined) the platform message ``message_id`` (a
        redelivery)."""
        journal = self._journals.get(sid)
        return journal is not None and any(
            entry.message.message_id == message_id or message_id in entry.message.joined
            for entry, _ in journal.pending.values()
        )

    async def finish(self, sid: str, entry_ids: set[str], *, reply: str | None = None) -> None:
        """Mark entries done (durably): their answer was delivered, or they need none any more."""
        if not entry_ids:
            return
        journal = self._journal(sid)
        path = self._path(sid)
        await self._append(path, journal, line_bytes(json.dumps({"done": sorted(entry_ids), "reply": reply})))
        for entry_id in entry_ids:
            journal.pending.pop(entry_id, None)
        journal.replies = {  # a kept answer is needed only while one of its entries is pending
            key: kept
            for key, kept in journal.replies.items()
            if key != reply and not set(kept[0].entries).isdisjoint(journal.pending)
        }
        journal.finished_lines += 1 + len(entry_ids)
        if not self._loaded or path in self._unread:
            return  # lines of an earlier run may still be unread: never cut them away
        # Decided and queued with no await in between: a line added later is queued after the cut or
        # the rewrite (it lands after it); one added earlier is pending, so it is kept.
        if not journal.pending and not journal.replies:
            journal.finished_lines = 0
            await self._writer.call(lambda: os.truncate(path, 0))
        elif journal.finished_lines > COMPACT_AFTER:
            journal.finished_lines = 0
            kept = [line for _, line in journal.pending.values()]
            kept += [line for _, line in journal.replies.values()]
            text = "".join(f"{x}\n" for x in kept)
            await self._writer.call(lambda: atomic_write_text(path, text))

    async def keep(self, reply: PendingReply) -> None:
        """Keep an answer that could not be sent, so the next start sends it (see bot/outbox.py)."""
        sid = reply.session_id
        journal = self._journal(sid)
        line = json.dumps({"reply": reply.to_record()}, ensure_ascii=False)
        if reply.id in journal.replies:
            return
        await self._append(self._path(sid), journal, line_bytes(line))
        journal.replies[reply.id] = (reply, line)

    async def expire(self, reply: PendingReply) -> Path:
        """Move a kept answer too old to be worth sending to ``inbox/expired/`` and mark its entries done;
        returns the file it went to. Written there (durably) before the done mark: a crash in between
        leaves it in both places, and the next start moves it again (one line twice, nothing lost)."""
        sid = reply.session_id
        where = self._dir / EXPIRED / f"{encode_id(sid)}.jsonl"
        line = json.dumps(
            {"reply": reply.to_record(), "expired_at": self._clock().isoformat()}, ensure_ascii=False
        )
        await self._writer.append(where, line_bytes(line))
        await self.finish(sid, set(reply.entries), reply=reply.id)
        log.warning(
            "kept_reply_expired",
            channel=reply.channel,
            chat_id=reply.chat_id,
            reply_id=reply.id,
            kept_since=reply.created_at.isoformat(),
            moved_to=str(where),
            tried_again="no: past dispatcher.kept_reply_max_age",
        )
        return where

    def kept_counts(self) -> dict[str, int]:
        """Answers kept aside per session (only sessions that have some): for the operator's views."""
        return {sid: len(j.replies) for sid, j in self._journals.items() if j.replies}

    def file(self, sid: str) -> Path:
        """Where ``sid``'s journal is: the operator finds its kept answers there (``{"reply": …}``)."""
        return self._path(sid)

    def kept_replies(self, sid: str) -> list[PendingReply]:
        journal = self._journals.get(sid)
        return [reply for reply, _ in journal.replies.values()] if journal else []

    def pending_ids(self, sid: str) -> list[str]:
        journal = self._journals.get(sid)
        return list(journal.pending) if journal else []

    def pending_messages(self, sid: str) -> list[InboundMessage]:
        """The messages of ``sid`` not finished yet, oldest first (a chat shows what it will answer)."""
        journal = self._journals.get(sid)
        return [entry.message for entry, _ in journal.pending.values()] if journal else []

    async def load_pending(self) -> list[InboxEntry]:
        """Entries a previous run accepted and never finished, oldest first per session."""
        entries = await asyncio.to_thread(self._load_sync)
        self._loaded = True
        return entries

    def _load_sync(self) -> list[InboxEntry]:
        found: list[InboxEntry] = []
        if not self._dir.is_dir():
            return found
        for path in sorted(self._dir.glob("*.jsonl")):
            try:
                read = _read(path)
            except IsADirectoryError:
                # It never becomes a file by itself (EIO may pass): every message of the chat was refused.
                _move_folder(path)
                continue
            except OSError as exc:
                # Its pending messages wait for a start that reads them; until then nothing cuts the file
                # (the chat's next answered message did: they were gone for good).
                self._unread.add(path)
                log.error(
                    "inbox_unreadable",
                    path=str(path),
                    error=exc.strerror,
                    kept="neither cut nor rewritten until a start reads it: restart once the disk reads it",
                )
                continue
            # Kept aside before a cut or a rewrite of the file (once everything is done) can drop it.
            aside = damaged.keep_aside(path, read.unreadable, event="inbox_lines_set_aside")
            if read.taken_as_done:
                log.warning(
                    "inbox_damaged_done_mark",
                    path=str(path),
                    entries=read.taken_as_done,
                    decided="taken as answered, not answered again: a damaged line was its done mark",
                    damaged_lines_in=str(aside) if aside else None,
                )
            pending, kept = read.pending, read.kept
            if not pending and not kept:
                continue
            sid = next(iter(pending.values()))[0].message.session_id if pending else _sid(kept)
            journal = self._journal(sid)
            journal.pending = {**pending, **journal.pending}
            journal.replies = {**kept, **journal.replies}
            journal.finished_lines = read.lines - len(pending) - len(kept)
            found.extend(entry for entry, _ in pending.values())
        return found

    def _journal(self, sid: str) -> _Journal:
        journal = self._journals.get(sid)
        if journal is None:
            journal = self._journals[sid] = _Journal()
        return journal

    def _path(self, sid: str) -> Path:
        return self._dir / f"{encode_id(sid)}.jsonl"


def _move_folder(path: Path, **context: object) -> None:
    """Move a folder that stands where a chat's inbox file belongs to ``<file>.corrupt-<time>`` (blocking)."""
    moved = damaged.corrupt_path(path)
    path.replace(moved)
    log.error(
        "inbox_file_is_a_folder",
        path=str(path),
        moved_to=str(moved),
        fix="none needed: the chat's messages are taken again; what was in the folder is in moved_to",
        **context,
    )


def kept_on_disk(directory: Path) -> dict[str, int]:
    """Answers kept aside per session, as the files in ``directory`` hold them now; reads only, so
    ``membot doctor`` may call it beside a running bot (a line being appended counts as unreadable)."""
    counts: dict[str, int] = {}
    if not directory.is_dir():
        return counts
    for path in sorted(directory.glob("*.jsonl")):
        try:
            kept = _read(path).kept
        except OSError:
            continue
        if kept:
            counts[_sid(kept)] = len(kept)
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


def _read(path: Path) -> _Read:
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


def _sid(replies: dict[str, tuple[PendingReply, str]]) -> str:
    return next(iter(replies.values()))[0].session_id


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
        **({"joined": list(message.joined)} if message.joined else {}),
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
