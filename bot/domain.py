"""The values every layer shares: messages, sessions, and what crosses a channel boundary.

Inbound and outbound messages are small frozen values (they cross layers); a Session is the one
mutable aggregate, owned by the SessionService and changed only by the turn that holds its lock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from bot.surrogates import scrub


def utcnow() -> datetime:
    return datetime.now(UTC)


def parse_time(text: str) -> datetime:
    """A stored time (ISO 8601); one written without a zone (by hand, by an older tool) is taken as
    UTC: a single naive time among aware ones makes every comparison with it raise (an inbox line
    edited by hand stopped every start)."""
    return as_utc(datetime.fromisoformat(text))


def as_utc(when: datetime) -> datetime:
    """``when``, read as UTC if it has no zone (see :func:`parse_time`)."""
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def session_id(channel: str, chat: str) -> str:
    """The one place a session id is built: ``<channel>:<chat>``."""
    return f"{channel}:{chat}"


_IDS = random.Random()  # seeded from os.urandom; its own, so a test seeding ``random`` cannot repeat ids


def new_id() -> str:
    """16 hex digits (64 random bits) naming a message, item or inbox entry.

    Not ``uuid4``: its ``os.urandom`` system call lets go of the GIL, and under load py-spy found the
    event loop's thread inside it in 7 % of its samples, waiting to get the GIL back from the worker
    threads (2.1 µs a call alone, 0.5 µs now). Ids are names, not secrets."""
    return f"{_IDS.getrandbits(64):016x}"


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class SessionState(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    TERMINATED = "terminated"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool invocation requested by the model. ``arguments`` is the raw JSON text (it may be invalid)."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        return cls(id=str(data["id"]), name=str(data["name"]), arguments=str(data.get("arguments", "")))


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image handed to a vision model (base64 payload)."""

    media_type: str
    data_b64: str


# A user message's ``meta`` key: in a group, the sender's name, which the message's content starts with
# ("Alice: ..."; bot/intake.py), so the model and memory know who said what.
SPEAKER_META = "speaker"


@dataclass(slots=True)
class Message:
    """One entry of a conversation, as stored in a session and sent to the model."""

    role: Role
    content: str
    timestamp: datetime = field(default_factory=utcnow)
    id: str = field(default_factory=new_id)
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None  # tool name on tool results
    token_estimate: int = 0
    images: tuple[ImagePart, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "role": self.role.value,
            "content": self.content,
            "ts": self.timestamp.isoformat(),
        }
        if self.tool_calls:
            data["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            data["name"] = self.name
        if self.token_estimate:
            data["tokens"] = self.token_estimate
        if self.meta:
            data["meta"] = self.meta
        # Images are not persisted: they are large and only matter for the turn they arrived in.
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        return cls(
            role=Role(data["role"]),
            content=str(data.get("content") or ""),
            timestamp=parse_time(data["ts"]) if "ts" in data else utcnow(),
            id=str(data.get("id") or new_id()),
            tool_calls=tuple(ToolCall.from_dict(c) for c in data.get("tool_calls") or ()),
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
            token_estimate=int(data.get("tokens") or 0),
            meta=dict(data.get("meta") or {}),
        )


@dataclass(slots=True)
class Usage:
    """Token and cost counters; added up per call, per session and per day."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    calls: int = 0
    # Of ``calls``, those the server sent no token counts for: membot counted them (bot/llm/estimates.py).
    estimated_calls: int = 0

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_tokens += other.cached_tokens
        self.cost_usd += other.cost_usd
        self.calls += other.calls
        self.estimated_calls += other.estimated_calls

    def to_dict(self) -> dict[str, Any]:
        out = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "cost_usd": round(self.cost_usd, 6),
            "calls": self.calls,
        }
        if self.estimated_calls:  # (only then: files without estimates stay as they were)
            out["estimated_calls"] = self.estimated_calls
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Usage:
        return cls(
            input_tokens=int(data.get("input_tokens", 0)),
            output_tokens=int(data.get("output_tokens", 0)),
            cached_tokens=int(data.get("cached_tokens", 0)),
            cost_usd=float(data.get("cost_usd", 0.0)),
            calls=int(data.get("calls", 0)),
            estimated_calls=int(data.get("estimated_calls", 0)),
        )


@dataclass(slots=True)
class Session:
    """A conversation: ``id = "<channel>:<chat>"``.

    ``messages`` is the active context. Messages that leave it (compaction, /new) are archived first by
    the memory layer; the session itself only tracks how many of its current messages are already on
    disk (``persisted_count``) so saving appends instead of rewriting.
    """

    id: str
    channel: str
    chat_id: str
    messages: list[Message] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    state: SessionState = SessionState.ACTIVE
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)
    usage: Usage = field(default_factory=Usage)
    compactions: int = 0
    # Persistence bookkeeping (owned by the store): messages[:persisted_count] are already on disk
    # unchanged; ``rewrite_needed`` forces a full rewrite after an in-place edit of older messages;
    # ``metadata_changed``: metadata changed with no message (a command's note, bot/intake.py), which
    # only a save keeps, so eviction and shutdown must see it as unsaved.
    persisted_count: int = 0
    rewrite_needed: bool = False
    metadata_changed: bool = False
    log_generation: int = 0
    log_bytes: int = 0

    @classmethod
    def new(cls, channel: str, chat_id: str) -> Session:
        return cls(id=session_id(channel, chat_id), channel=channel, chat_id=chat_id)

    def summary(self) -> dict[str, Any]:
        """Everything about the session except its messages, as JSON-ready values."""
        return {
            "id": self.id,
            "channel": self.channel,
            "chat_id": self.chat_id,
            "state": self.state.value,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "metadata": self.metadata,
            "usage": self.usage.to_dict(),
            "compactions": self.compactions,
        }

    @property
    def unsaved(self) -> bool:
        """Whether messages changed since the last save, or a command's note (``metadata_changed``: the
        other metadata changes with a turn's messages); cache eviction and shutdown look first."""
        return self.rewrite_needed or self.metadata_changed or self.persisted_count != len(self.messages)

    def append(self, message: Message) -> None:
        self.messages.append(message)
        self.updated_at = utcnow()

    def replace_messages(self, messages: list[Message]) -> None:
        """Swap the active context (compaction, trimming, /new); the next save rewrites the log."""
        self.messages = list(messages)
        self.rewrite_needed = True
        self.updated_at = utcnow()


AttachmentKind = Literal["image", "text", "file"]


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file that came with an inbound message, already downloaded by the channel."""

    kind: AttachmentKind
    name: str
    mime_type: str
    data: bytes = b""
    size: int = 0


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """A platform message normalized by its channel adapter; the only thing the dispatcher accepts."""

    channel: str
    chat_id: str
    sender_id: str
    text: str
    sender_name: str = ""
    message_id: str | None = None
    timestamp: datetime = field(default_factory=utcnow)
    attachments: tuple[Attachment, ...] = ()
    is_group: bool = False
    # The platform ids of the messages joined into this one after the first (a paste its client split,
    # channels/telegram/inbound.py): a redelivery of any of them is this message again.
    joined: tuple[str, ...] = ()
    # ``timestamp`` is the platform's (Telegram's, Discord's servers keep time), not our clock's: when our
    # clock is far behind it (a board booted at 1970 before NTP), the message is dated by it (bot/intake.py).
    platform_date: bool = False

    def __post_init__(self) -> None:
        # Platform JSON can carry lone surrogates, which no file can store: scrubbed once, here.
        object.__setattr__(self, "text", scrub(self.text))
        object.__setattr__(self, "sender_name", scrub(self.sender_name))

    @property
    def session_id(self) -> str:
        return session_id(self.channel, self.chat_id)


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """A reply on its way back out through the channel that brought the question."""

    channel: str
    chat_id: str
    text: str
    reply_to: str | None = None
    is_error: bool = False
    # A reply beside the chat's running turn (a command's, a notice): it must not take over the message
    # that turn is streaming into.
    aside: bool = False
    # The same answer sent again (after a failure) carries the same key, so a channel that delivered
    # part of it sends only the rest.
    key: str | None = None
