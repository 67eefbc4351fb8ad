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
Damaged lines (a torn append) cost only themselves, and one that was a done mark does not make the next
start answer its messages again: bot/inbox_file.py reads a file back and says how.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import structlog

from bot import damaged, inbox_file
from bot.domain import InboundMessage, new_id, utcnow
from bot.group_writer import GroupWriter
from bot.inbox_file import InboxEntry
from bot.outbox import PendingReply
from bot.session_names import encode_id
from bot.storage import atomic_write_text, line_bytes

log = structlog.get_logger(__name__)

COMPACT_AFTER = 64  # finished lines a file may gather while something is pending, before a rewrite
EXPIRED = "expired"  # the folder, inside the inbox's, of kept answers too old to send (see the module doc)


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
        line = inbox_file.entry_line(entry)
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
        line = inbox_file.reply_line(reply)
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
                read = inbox_file.read(path)
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
            sid = next(iter(pending.values()))[0].message.session_id if pending else inbox_file.sid(kept)
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
        return inbox_file.path_of(self._dir, sid)


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
