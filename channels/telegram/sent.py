"""How far each answer got: the chunks Telegram took and the preview it streams in, on disk, so a
restart sends only the rest.

An answer longer than one message goes out in chunks, paced about one a second per chat, and its
inbox entries are marked done only once the last one went out (``bot/outbox.py``). Killed between two
chunks, the next start sent the answer again from its first chunk: the chat got those chunks twice.
So after each chunk but the last, :func:`sent_chunks` writes how many chunks of the answer (by its
key, the pending reply's id, the same after a restart) Telegram took, and a send of that answer skips
them. A chunk Telegram finds too long goes out halved (:mod:`channels.telegram.outbound`), and the
record follows the halves: ``(2, 1)`` says two chunks and the first half of the third went out (a half
halved again adds a number). The halves are cut the same way each time, so a send that goes on from
a half sends exactly the halves not yet shown. The window left is the one no platform lets us close:
Telegram took a message and the process died before the write of that fact reached the disk (one
fsync). The last message is not written here: what follows it is the inbox's done mark, whose window
is as wide.

A streamed answer (``telegram.streaming``) is shown as it comes in one preview message. Killed before
the answer went out, the preview stayed in the chat, and the answer sent after the restart (saved, or
asked for anew and streamed again) came as new messages: the chat saw its start twice. So the preview's
message id is written too, per chat, with the id of the message it answers (the turn's first, which
the answer's ``reply_to`` names: an answer to another question never takes it over). The answer to
that message then goes into the preview, as in the same run; the write costs one fsync per streamed
answer.

``state/telegram_sent.json`` holds ``{"answers": {key: chunks}, "previews": {chat: [reply_to, id]}}``
(``[chunks, halves, ...]`` once a chunk went out in part) for the newest ``limit`` answers cut short
and chats with a preview; a finished answer, and a preview its answer went into, are dropped with the
next write. A write that fails (a full disk) is logged and only costs what this file adds: the
process still remembers, a restart would send those messages again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from channels.kept_state import LIMIT, Previews, SentRecord, is_count

SENT_FILE = "telegram_sent.json"

Progress = tuple[int, ...]
"""How far an answer got: its first ``progress[0]`` chunks went out and, when a chunk went out halved,
``progress[1]`` halves of the next one (and so on, inside a half halved again). ``()``: nothing yet."""

SentChunks = SentRecord[Progress]
"""Chunks of each answer Telegram took, and the preview each chat's answer streams in."""


def sent_chunks(path: Path | None, *, limit: int = LIMIT) -> SentChunks:
    """The record kept at ``path`` (``None``: in memory only, for tests of the channel's parts);
    :meth:`~SentRecord.load` it before the first send and :meth:`~SentRecord.close` it at the stop."""
    return SentRecord(
        path, nothing=(), encode=_encoded, parse=_parsed, event="telegram_sent_chunks", limit=limit
    )


def _encoded(answers: dict[str, Progress], previews: Previews) -> Any:
    return {
        "answers": {key: got[0] if len(got) == 1 else list(got) for key, got in answers.items()},
        "previews": {chat: list(seen) for chat, seen in previews.items()},
    }


def _parsed(data: Any) -> tuple[dict[str, Progress], Previews]:
    found = {str(k): _progress(v) for k, v in data["answers"].items()}
    previews = {
        str(chat): (seen[0], seen[1])
        for chat, seen in data.get("previews", {}).items()  # none before previews were kept
        if isinstance(seen, list) and len(seen) == 2 and isinstance(seen[0], str) and is_count(seen[1])
    }
    return {k: v for k, v in found.items() if v}, previews


def _progress(value: Any) -> Progress:
    """A stored record: a count of chunks (all an earlier version wrote), or a list that goes into
    halves; ``()`` for anything else, or for nothing sent."""
    got = [value] if isinstance(value, int) else value
    if not isinstance(got, list) or not got:
        return ()
    if not all(is_count(n) for n in got) or not any(got):
        return ()
    return tuple(got)
