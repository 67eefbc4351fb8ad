"""What the next start does with each message a previous run accepted and did not finish.

For every pending inbox entry (``bot/inbox.py``) of a session, in arrival order:

1. its answer was saved (a reply record in the session log, or kept in the inbox after a failed
   send): send that answer again; the model is not asked twice. An answer kept in the inbox for
   longer than ``dispatcher.kept_reply_max_age`` (its chat has refused the bot since) is moved to
   ``inbox/expired/`` instead (:meth:`~bot.inbox.Inbox.expire`), and its messages are done;
2. it was accepted longer than ``dispatcher.recover_max_age`` ago: tell the user it was skipped
   rather than answer a question that has gone stale;
3. the session already holds it (the turn was cut short after saving the question: grace period
   over, a cancelled tool loop): answer it without adding it to the session a second time, and in one
   turn with the others that turn stored (``Dispatcher.recover``), as that turn would have;
4. otherwise: answer it as if it had just arrived (an entry that is a command, /new or /compact kept
   while it waited for a turn, is run in its place instead: bot/dispatcher/turns.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog

from bot import intake
from bot.domain import InboundMessage, Message, utcnow
from bot.errors import StorageError
from bot.inbox import Inbox
from bot.inbox_file import InboxEntry
from bot.outbox import PendingReply
from bot.session_service import SessionService

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Answer:
    """A recovered message to answer in a turn."""

    message: InboundMessage
    entry_id: str
    in_session: bool  # the session already holds it: do not append it again

    @property
    def channel(self) -> str:
        return self.message.channel

    @property
    def chat_id(self) -> str:
        return self.message.chat_id


Work = Answer | PendingReply


async def recover(
    inbox: Inbox, sessions: SessionService, *, max_age: float, kept_max_age: float = 0.0
) -> dict[str, list[Work]]:
    """Load the inbox's pending entries and plan each session's work (see the module doc).

    A saved answer found only in the session log is first copied into the inbox, so that a rewrite
    of the log (compaction) before it is sent again cannot drop it. A copy the disk refuses (a full
    disk) does not stop the start: the answer is sent from the log as it is, and should a rewrite drop
    it before, its messages, still pending, are answered again.
    """
    by_session: dict[str, list[InboxEntry]] = {}
    for entry in await inbox.load_pending():
        by_session.setdefault(entry.message.session_id, []).append(entry)
    planned: dict[str, list[Work]] = {}
    counts = {"resend": 0, "skip": 0, "answer": 0, "resume": 0, "expired": 0}
    now = utcnow()
    for sid, entries in by_session.items():
        kept: dict[str, PendingReply] = {}
        for reply in inbox.kept_replies(sid):
            if reply.expired(kept_max_age, now):
                try:
                    await inbox.expire(reply)
                    counts["expired"] += 1
                    continue
                except (StorageError, OSError) as exc:  # a full disk: tried once more, moved next time
                    log.error("kept_reply_expiry_failed", session_id=sid, reply_id=reply.id, error=str(exc))
            kept[reply.id] = reply
        still = set(inbox.pending_ids(sid))  # an expired answer's messages are done
        entries = [e for e in entries if e.entry_id in still]
        if not entries:
            continue
        try:
            session = await sessions.get(sid)
            saved = {r.id: r for r in await sessions.replies(sid)}
        except StorageError:
            log.exception("recovery_session_unreadable", session_id=sid)
            session, saved = None, {}
        work = plan(
            entries,
            messages=session.messages if session else (),
            replies=[*kept.values(), *saved.values()],
            now=now,
            max_age=max_age,
        )
        for item in work:
            if isinstance(item, Answer):
                counts["resume" if item.in_session else "answer"] += 1
            elif item.id in kept or item.id in saved:
                counts["resend"] += 1
                if item.id not in kept:
                    try:
                        await inbox.keep(item)
                    except (StorageError, OSError) as exc:  # a full disk: sent from the log all the same
                        log.error("kept_reply_copy_failed", session_id=sid, reply_id=item.id, error=str(exc))
            else:
                counts["skip"] += 1
        planned[sid] = work
    if planned or counts["expired"]:
        log.info("inbox_recovered", sessions=len(planned), **counts)
    return planned


def plan(
    entries: Sequence[InboxEntry],
    *,
    messages: Sequence[Message],
    replies: Iterable[PendingReply],
    now: datetime,
    max_age: float,
) -> list[Work]:
    """The work, in order, that finishes ``entries`` (one session's pending entries, oldest first).

    ``messages`` is the session as saved; ``replies`` the saved and kept answers (duplicates by id
    are fine), sent again in the order of the messages they answer: the inbox's order is the order
    the chat asked in, while their ``created_at`` is the machine's clock, which may have stepped back
    between them. ``max_age`` in seconds; 0 answers whatever the age.
    """
    place = {e.entry_id: i for i, e in enumerate(entries)}
    work: list[Work] = []
    covered: set[str] = set()
    seen: set[str] = set()

    def asked(reply: PendingReply) -> tuple[int, datetime]:
        return min((place.get(e, len(place)) for e in reply.entries), default=len(place)), reply.created_at

    for reply in sorted(replies, key=asked):
        if reply.id in seen or not place.keys() & set(reply.entries):
            continue
        seen.add(reply.id)
        work.append(reply)
        covered.update(reply.entries)
    in_session = intake.entries_in(messages)
    for entry in entries:
        if entry.entry_id in covered:
            continue
        if max_age and now - entry.accepted_at > timedelta(seconds=max_age):
            work.append(skipped(entry))
        else:
            work.append(Answer(entry.message, entry.entry_id, entry.entry_id in in_session))
    return work


def skipped(entry: InboxEntry) -> PendingReply:
    """The notice for a message that waited too long to be answered after a restart."""
    message = entry.message
    preview = " ".join(message.text.split())
    if len(preview) > 80:
        preview = preview[:77] + "…"
    when = entry.accepted_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    quoted = f" (“{preview}”)" if preview else ""
    text = (
        f"Sorry — I was offline and did not answer your message from {when}{quoted} in time. "
        "Please send it again if it still matters."
    )
    return PendingReply(
        message.channel, message.chat_id, text, (entry.entry_id,), reply_to=message.message_id, is_error=True
    )
