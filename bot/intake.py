"""What an accepted message becomes in a session, and how the session remembers where it came from.

Each inbound message turns into one user :class:`~bot.domain.Message` whose ``meta`` keeps the
platform's message id and the inbox entries it came from. Recovery reads the entries back to tell a
question the session already holds from one it never saw (bot/recovery.py). To recognize a platform's
redelivery of a message it already took, the session also notes the platform ids of the latest messages
it took in its metadata (:func:`add_message`): /new and memory's trim of a long session take messages
out of the history, not out of what a platform may hand over again. A command leaves no message: the
session notes its platform id among the commands run instead (:func:`note_command`).

A message is never dated before the session's last one (:func:`dated`), nor before the last one it
took in (noted in its metadata: /new clears the history, not memory): memory takes the newest statement
on a subject as the current one, so a clock stepped back must not make "I moved to Berlin" older than
what it corrects.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

import structlog

from bot.domain import (
    SPEAKER_META,
    ImagePart,
    InboundMessage,
    Message,
    Role,
    Session,
    as_utc,
    parse_time,
    utcnow,
)

log = structlog.get_logger(__name__)

INBOX_META = "inbox"  # user message meta: the inbox entries it came from, comma-separated
SPEAKER_CHARS = 64  # the longest name put before a group message
DEDUP_WINDOW = 100  # recent session messages searched for a redelivered message (saved before notes)
MESSAGES_META = "messages_taken"  # session.metadata: platform ids of the latest messages taken in
COMMANDS_META = "commands_run"  # session.metadata: platform ids of the latest commands run in the chat
DATED_META = "last_dated"  # session.metadata: the date of the latest message taken in (see dated)
# Messages and commands a session notes at the least (every save carries the lists): Telegram's update
# journal takes an update once, so only the last few come again (a kill between the inbox's fsync and
# the journal's). A channel that hands over more again raises it: Discord's catch-up hands over up to
# ``discord.catch_up_max_messages`` after a mark not on disk yet (``Dispatcher``'s ``redelivery_window``).
# Fewer, and a command it reads again ran again, and noted, pushed out the next one, which ran again too.
COMMANDS_NOTED = 20
# How far back the machine's clock may step (below the session's last message) for a chat's dates to
# hold at that message: a Raspberry Pi that starts before NTP (fake-hwclock saves hourly), an NTP
# correction, a VM restored from a recent snapshot. A larger step is taken as the correction of a clock
# that was wrong ahead: held, every date of the chat would stick at the wrong one until the clock caught
# up (see :func:`dated`).
HOLD_LIMIT = timedelta(days=1)
# A platform's date this far ahead of our clock is no sender's skew: our clock is behind (said in the log,
# each message, until it is set right; the date is capped at our clock all the same).
CLOCK_BEHIND = timedelta(minutes=10)
AFTER = timedelta(microseconds=1)  # a held message comes this much after the last one, never with it


def speaker(inbound: InboundMessage) -> str:
    """The name a group message is said under ("" in a private chat): one line, so a name cannot pass
    for text of the message. A member the platform gave no name is "user <id>": unnamed, their words
    would read (and be remembered) as nobody's, and another member's "my job" could find theirs."""
    if not inbound.is_group:
        return ""
    name = " ".join(inbound.sender_name.split())[:SPEAKER_CHARS].rstrip(":").strip()
    return name or (f"user {inbound.sender_id}"[:SPEAKER_CHARS] if inbound.sender_id else "")


def user_message(
    inbound: InboundMessage, entries: Sequence[str] = (), *, timestamp: datetime | None = None
) -> Message:
    """The session's user message for ``inbound`` (attachments described or passed as images), dated
    ``timestamp`` (by default its platform's date, capped at our clock; :func:`add_message` dates it
    after the session's last message, see :func:`dated`).

    In a group several people talk in one session, so a message starts with its sender's name
    ("Alice: ..."): the model knows who asks, and memory, the daily notes and summaries keep who said
    what (see ``bot.memory.extract.Utterance.speaker``)."""
    parts = [inbound.text] if inbound.text else []
    images: list[ImagePart] = []
    for attachment in inbound.attachments:
        if attachment.kind == "image" and attachment.data:
            images.append(ImagePart(attachment.mime_type, base64.b64encode(attachment.data).decode("ascii")))
            parts.append(f"[image: {attachment.name}]")
        elif attachment.kind == "text":
            body = attachment.data.decode("utf-8", errors="replace")
            parts.append(f"[file {attachment.name}]\n{body}")
        else:
            size = f"{attachment.mime_type}, {attachment.size} bytes"
            parts.append(f"[file {attachment.name} ({size}) received]")
    meta: dict[str, object] = {"sender_id": inbound.sender_id}
    if inbound.sender_name:
        meta["sender_name"] = inbound.sender_name
    name = speaker(inbound)
    if name and parts:
        parts[0] = f"{name}: {parts[0]}"
        meta[SPEAKER_META] = name
    if inbound.message_id:
        meta["message_id"] = inbound.message_id
    if entries:
        meta[INBOX_META] = ",".join(entries)
    return Message(
        role=Role.USER,
        content="\n\n".join(parts),
        # Dated as the turn is (see turn_time): a platform date ahead of our clock would put the
        # question after its own answer, in the session and in memory.
        timestamp=min(as_utc(inbound.timestamp), utcnow()) if timestamp is None else timestamp,
        images=tuple(images),
        meta=meta,
    )


def bounded(message: InboundMessage, max_chars: int) -> InboundMessage:
    """``message`` with its text cut to ``max_chars`` and a note saying so."""
    if len(message.text) <= max_chars:
        return message
    note = f"\n\n[message truncated: {len(message.text)} characters, limit {max_chars}]"
    return dataclasses.replace(message, text=message.text[:max_chars] + note)


def entries_in(messages: Iterable[Message]) -> set[str]:
    """Inbox entry ids the session's user messages came from."""
    found: set[str] = set()
    for message in messages:
        tag = message.meta.get(INBOX_META) if message.role is Role.USER else None
        if isinstance(tag, str) and tag:
            found.update(tag.split(","))
    return found


def add_message(
    session: Session, inbound: InboundMessage, entries: Sequence[str], *, keep: int, now: datetime
) -> None:
    """Add ``inbound`` to the session's history (:func:`user_message`), dated by :func:`dated` with our
    clock's ``now``, and note its platform id among the latest ``keep`` messages taken (at least
    :data:`COMMANDS_NOTED`), saved with it."""
    when = dated(inbound.timestamp, now, session, platform=inbound.platform_date)
    message = user_message(inbound, entries, timestamp=when)
    session.append(message)
    session.metadata[DATED_META] = message.timestamp.isoformat()
    for message_id in (inbound.message_id, *inbound.joined) if inbound.message_id else ():
        _note(session, MESSAGES_META, message_id, keep)


def taken_before(session: Session, message_id: str) -> bool:
    """Whether the session took the platform message ``message_id`` in: noted (see :func:`add_message`),
    or in its recent history (a session saved before it noted them)."""
    return message_id in _noted(session, MESSAGES_META) or already_taken(session.messages, message_id)


def already_taken(messages: Sequence[Message], message_id: str) -> bool:
    """Whether a recent user message of the history ``messages`` is the platform message ``message_id``."""
    recent = messages[-DEDUP_WINDOW:]
    return any(m.role is Role.USER and m.meta.get("message_id") == message_id for m in recent)


def command_run(session: Session, message_id: str) -> bool:
    """Whether the session noted the command ``message_id`` as run (see :func:`note_command`)."""
    return message_id in _noted(session, COMMANDS_META)


def note_command(session: Session, message_id: str, *, keep: int = COMMANDS_NOTED) -> None:
    """Note the command ``message_id`` as run, before it acts: the note is saved with what it does
    (/new's cleared session, /compact's, the turn a /stop cut short), so once its work is on disk a
    platform's redelivery is recognized, as a message is by its place in the history. A command that
    changes nothing is saved with its note before its reply, or with the work of the turn that holds the
    session then; until it is saved, the session counts as unsaved (``Session.unsaved``). The latest
    ``keep`` stay (at least :data:`COMMANDS_NOTED`): as many as a channel may hand over again."""
    _note(session, COMMANDS_META, message_id, keep)


def _noted(session: Session, key: str) -> list[str]:
    """The ids noted under ``key`` (none, when a hand-edited file holds something else there)."""
    noted = session.metadata.get(key)
    return noted if isinstance(noted, list) else []


def _note(session: Session, key: str, message_id: str, keep: int) -> None:
    kept = [i for i in _noted(session, key) if i != message_id]
    session.metadata[key] = [*kept, message_id][-max(keep, COMMANDS_NOTED) :]
    session.metadata_changed = True  # a command leaves no message: the note alone makes it unsaved


def forget_command(session: Session, message_id: str) -> None:
    """Take a note back: the command waits for its turn after all (its place in the inbox tells)."""
    noted = _noted(session, COMMANDS_META)
    if message_id in noted:
        noted.remove(message_id)


def turn_time(messages: Iterable[InboundMessage], session: Session, now: datetime) -> datetime:
    """When a turn happens: the date of its newest message, as its platform dated it, so memory files
    and recalls what was said at the time it was said. A date ahead of our clock ``now`` (a skewed
    sender) is taken as now, unless our clock is far behind the platform's (see :func:`dated`); a date
    without a zone is read as UTC. Never before the session's last message (its own, added already: see
    :func:`dated`), so its answer is not dated before its question.
    """
    newest = max(messages, key=lambda m: as_utc(m.timestamp), default=None)
    if newest is None:
        return dated(now, now, session, step=0)
    return dated(newest.timestamp, now, session, step=0, platform=newest.platform_date)


def _last_dates(session: Session) -> list[datetime]:
    """The session's last message's date and the noted one (none that a hand edit left unreadable)."""
    dates = [session.messages[-1].timestamp] if session.messages else []
    noted = session.metadata.get(DATED_META)
    if isinstance(noted, str):
        with contextlib.suppress(ValueError):
            dates.append(parse_time(noted))
    return dates


def dated(
    claimed: datetime, now: datetime, session: Session, *, step: int = 1, platform: bool = False
) -> datetime:
    """The date of a message ``claimed`` (by its platform) that ``session`` takes in at our clock's
    ``now``: ``claimed``, capped at ``now`` (a date ahead of our clock is a skewed sender's; more than
    :data:`CLOCK_BEHIND` ahead, our clock is behind, and the log says so with the fix), and never
    earlier than the session's last message, or the last one it took in before a /new cleared it
    (``step`` microseconds after it).

    ``platform``: ``claimed`` is a platform's date (``InboundMessage.platform_date``). When our clock is
    behind it by more than :data:`HOLD_LIMIT`, no sender's skew explains it: our clock is wrong (a board
    that booted at 1970 before NTP, with no real-time clock), and dated by it the chat's messages would
    go to 1970, and memory with them. The platform's date stands in for our clock then (still never
    before the last message), and the log still says so.

    Our clock steps back at times (a Raspberry Pi that starts before NTP, an NTP correction, a VM
    restored from a snapshot); dated by it, a message came before earlier ones, and memory took the
    older statement for the current one ("I moved to Berlin" lost to "I live in Lisbon"), as did
    today's notes. A step back of up to :data:`HOLD_LIMIT` is held at the last message. A larger one is
    taken as a clock that was wrong ahead and is right again: held, the chat's dates would stick at the
    wrong one for as long as that clock needs to catch up. It is logged (``clock_went_back``, with both
    times) and the clock is taken.
    """
    claimed = as_utc(claimed)
    far_behind = platform and claimed - now > HOLD_LIMIT
    if step and claimed - now > CLOCK_BEHIND:  # (once per message: its turn asks again with step 0)
        log.warning(
            "clock_behind_platform",
            session_id=session.id,
            clock=now.isoformat(),
            platform_date=claimed.isoformat(),
            dated_by="the platform's date" if far_behind else "the machine's clock",
            fix="the machine's clock is behind the chat platform's, and messages are dated by it (in the "
            "session and in memory) unless it is a day behind; set it right (NTP: "
            "`timedatectl set-ntp true`)",
        )
    if far_behind:
        now = claimed
    when = min(claimed, now)
    last = max(_last_dates(session), default=None)
    floor = None if last is None else last + step * AFTER
    if floor is None or when >= floor:
        return when
    if last is not None and last - now > HOLD_LIMIT:
        log.warning(
            "clock_went_back",
            session_id=session.id,
            clock=now.isoformat(),
            last_message=last.isoformat(),
            held_up_to=str(HOLD_LIMIT),
        )
        return when
    return floor
