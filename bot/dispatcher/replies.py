"""What a turn says to its chat: the reply it saves and sends, and the notices for what went wrong
outside the pipeline (storage refusing a read or a save, a crash).

Pure words, kept apart from the lane's worker (bot/dispatcher/turns.py) that decides when each is
said: a failure is told in plain words chosen by its type, never in the exception's text, which names
servers, settings and exception types and belongs in the log.
"""

from __future__ import annotations

from datetime import datetime

from bot.dispatcher.lanes import Lane
from bot.errors import plain_reason
from bot.long_answers import bounded
from bot.model_wait import model_failure
from bot.outbox import PendingReply
from pipeline import Turn

STORAGE_NOTICE = (
    "⚠️ I have an answer but cannot save our conversation right now (a problem on the server). "
    "I'll send it as soon as I can — nothing is lost."
)


STOP_STORAGE_NOTICE = (
    "⚠️ Stopped, but I can't save that in our conversation right now (a problem on the server). "
    "I'll do it as soon as I can — nothing is lost."
)

LOAD_STORAGE_NOTICE = (
    "⚠️ I can't read our conversation right now (a problem on the server). "
    "I'll answer as soon as I can — nothing is lost."
)


def crash_notice(exc: Exception) -> str:
    """What the chat is told when its turn failed outside the pipeline (a bug: a session storage cannot
    read is read again until it can, see ``Turns._readable``): the messages stay pending in the inbox,
    and the next start answers them."""
    return (
        f"⚠️ Sorry, I couldn't answer this ({plain_reason(type(exc))}). "
        "Your message is kept: I'll answer it after my next restart."
    )


def pending_reply(
    lane: Lane, turn: Turn, entries: tuple[str, ...], now: datetime
) -> tuple[PendingReply, bool]:
    """The turn's reply to its first message, to be saved and sent (made at our clock's ``now``: how old
    a kept one is), and whether it reports a failure."""
    text, is_error = reply_text(turn)
    first = turn.inbound[0]
    reply = PendingReply(
        lane.channel,
        lane.chat_id,
        text,
        entries,
        reply_to=first.message_id,
        is_error=is_error,
        created_at=now,
    )
    return reply, is_error


def reply_text(turn: Turn) -> tuple[str, bool]:
    """The reply and whether it reports a failure. A failure is told in plain words chosen by its
    type: its text names servers, settings and exception types, which belong in the log (where the
    pipeline put it, secrets redacted), not in a chat. An answer is bounded (bot/long_answers.py)
    whatever set it: the tool loop bounds the model's, as the session keeps it."""
    notes = "\n\n".join(f"_{note}_" for note in turn.notes)
    if turn.answered:  # a blank answer is no answer: channels drop or mangle it
        return (bounded(str(turn.reply)) + (f"\n\n{notes}" if notes else "")), False
    if turn.final_note and not turn.failures:  # the model declined, or had no room left: asking
        return "⚠️ " + " ".join(turn.notes), True  # again would meet the same, so no "try again" here
    if turn.failures:
        reason = plain_reason((model_failure(turn) or turn.failures[-1]).kind)
    elif turn.notes:
        reason = " ".join(turn.notes)
    else:
        reason = "the model returned an empty answer"
    text = (
        f"⚠️ Sorry, I couldn't answer this time ({reason}). "
        "Your message is saved — send another message to try again."
    )
    return text, True
