"""The outbox: an answer is saved before it is sent, and counts as delivered only once the platform said so.

A turn's answer becomes a :class:`PendingReply`. It is written with the turn's messages, in the same
append of the session log (``bot/sessions.py``), before the channel is asked to send it; the inbox
(``bot/inbox.py``) marks its entries done only after ``Channel.send`` returned. After a crash, a
pending reply found in the session log is sent again instead of asking the model a second time.

Exactly once, as far as a platform allows: if the process dies after the platform accepted the send
but before the done mark reached the disk, the next start sends the answer again (at least once).
That window is one fsync wide; no chat platform offers an idempotent send that would close it. An
answer sent in several messages keeps it that narrow: the channel notes, per answer key, the parts
that went out (``channels/telegram/sent.py``, ``channels/discord/sent.py``; Discord also drops a part
sent again within minutes by its nonce), so after a kill between two parts only the rest goes out.

A reply whose send fails for good (the channel gave up after its retries) is copied into the inbox
journal, where a later compaction of the session cannot drop it, and is sent again on the next start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from bot.domain import OutboundMessage, new_id, parse_time, session_id, utcnow

RECORD = "reply"  # the ``record`` tag of a pending reply in the session log


@dataclass(frozen=True, slots=True)
class PendingReply:
    """An answer on its way out: what to send, where, and which inbox entries it answers."""

    channel: str
    chat_id: str
    text: str
    entries: tuple[str, ...]
    reply_to: str | None = None
    is_error: bool = False
    id: str = field(default_factory=new_id)
    created_at: datetime = field(default_factory=utcnow)
    # A command's reply, sent beside a turn that may be streaming its own answer (not stored: sent again
    # after a restart, it goes in its lane's order, with no turn beside it).
    aside: bool = False

    @property
    def session_id(self) -> str:
        return session_id(self.channel, self.chat_id)

    def expired(self, max_age: float, now: datetime) -> bool:
        """Kept longer than ``max_age`` seconds (``dispatcher.kept_reply_max_age``; 0: never too old)."""
        return bool(max_age) and now - self.created_at > timedelta(seconds=max_age)

    def outbound(self) -> OutboundMessage:
        return OutboundMessage(
            self.channel,
            self.chat_id,
            self.text,
            reply_to=self.reply_to,
            is_error=self.is_error,
            key=self.id,
            aside=self.aside,
        )

    def to_record(self, *, text_of: str | None = None) -> dict[str, Any]:
        """The JSON object stored for it. ``text_of`` names a message of the same save whose content
        is exactly the text, so the common reply is not stored twice."""
        data: dict[str, Any] = {
            "record": RECORD,
            "id": self.id,
            "channel": self.channel,
            "chat_id": self.chat_id,
            "entries": list(self.entries),
            "at": self.created_at.isoformat(),
        }
        if text_of is not None:
            data["text_of"] = text_of
        else:
            data["text"] = self.text
        if self.reply_to is not None:
            data["reply_to"] = self.reply_to
        if self.is_error:
            data["error"] = True
        return data

    @classmethod
    def from_record(cls, data: dict[str, Any], *, texts: dict[str, str] | None = None) -> PendingReply:
        """Read a stored reply; ``texts`` (message id -> content) resolves a ``text_of`` reference."""
        text = (texts or {})[str(data["text_of"])] if "text_of" in data else str(data["text"])
        return cls(
            channel=str(data["channel"]),
            chat_id=str(data["chat_id"]),
            text=text,
            entries=tuple(str(e) for e in data.get("entries") or ()),
            reply_to=None if data.get("reply_to") is None else str(data["reply_to"]),
            is_error=bool(data.get("error")),
            id=str(data["id"]),
            created_at=parse_time(data["at"]),
        )
