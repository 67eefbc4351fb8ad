"""How far each answer got on Discord: the parts that went out and the preview it streams in, on disk,
so a restart sends only the rest, and in the right message.

A streamed answer (``discord.streaming``) is shown as it comes in one preview message, ending in " …".
Killed before the answer went out (or stopped past the grace period), the preview stayed in the chat,
and the answer the next start sent (saved, or asked for anew and streamed again) came as new messages
below it: half an answer above the whole one. So the preview's message id is written as soon as
Discord posted it, per chat, with the id of the message it answers (the turn's first, which the
answer's ``reply_to`` names: an answer to another question never takes it over). The answer to that
message then goes into the preview, whether it is sent again after a failure, after a restart, or
streamed anew; one the user (a moderator) deleted is sent as a new message instead. The write costs one
fsync per streamed answer.

An answer longer than one message goes out in parts, and its inbox entries are marked done only once
the last one went out (``bot/outbox.py``). Each part carries a nonce made from the answer's key, but
Discord checks a nonce only against the past few minutes: sent again later (a restart after a longer
outage, a send the dispatcher tries again after minutes of failures), the parts that went out came a
second time, and a first part that went into a preview never had a nonce at all. So after each part
but the last, :func:`sent_parts` writes how many parts of the answer (by its key, the pending reply's
id, the same after a restart) Discord took, and a send of that answer skips them. The window left is
the one no platform lets us close: Discord took a message and the process died before the write of
that fact reached the disk (one fsync; within minutes the nonce still covers it).

``state/discord_sent.json`` holds ``{"answers": {key: parts}, "previews": {chat: [reply_to, id]}}``
(ids as strings, as Discord writes its snowflakes) for the newest ``limit`` answers cut short and chats
with a preview. A finished answer, and a preview its answer went into, are forgotten at once and
dropped from the file with the next write (or when the channel stops). A write that fails (a full
disk) is logged and only costs what this file adds: the process still remembers, a restart would send
those parts again, or the answer below its preview.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from channels.kept_state import LIMIT, Previews, SentRecord, is_count

SENT_FILE = "discord_sent.json"

SentParts = SentRecord[int]
"""Parts of each answer Discord took (0: none), and the preview each chat's answer streams in."""


def sent_parts(path: Path | None, *, limit: int = LIMIT) -> SentParts:
    """The record kept at ``path`` (``None``: in memory only); :meth:`~SentRecord.load` it before the
    first send and :meth:`~SentRecord.close` it when the channel stops."""
    return SentRecord(
        path, nothing=0, encode=_encoded, parse=_parsed, event="discord_sent_parts", limit=limit
    )


def _encoded(answers: dict[str, int], previews: Previews) -> Any:
    return {
        "answers": answers,
        "previews": {chat: [seen[0], str(seen[1])] for chat, seen in previews.items()},
    }


def _parsed(data: Any) -> tuple[dict[str, int], Previews]:
    answers = {str(key): parts for key, parts in data["answers"].items() if is_count(parts) and parts}
    previews = {
        str(chat): (seen[0], int(seen[1]))
        for chat, seen in data["previews"].items()
        if isinstance(seen, list) and len(seen) == 2 and isinstance(seen[0], str) and _is_id(seen[1])
    }
    return answers, previews


def _is_id(value: Any) -> bool:
    """A snowflake as the file writes it: a string of digits."""
    return isinstance(value, str) and value.isascii() and value.isdigit()
