"""The seam every pipeline system plugs into: the ``System`` protocol and the per-turn ``Turn``.

A turn is one run of the pipeline for one session: it starts with the inbound messages the dispatcher
collected and ends with a reply. Systems read and write the ``Turn`` and never call one another; what
two of them need is a service the composition root hands to both. Compaction is one: AutoCompaction
compacts before the model is asked, and the ToolLoop calls the same ``ContextBudget`` to compact in the
middle of a turn when a request would not fit or the provider refused it as too long.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from bot.domain import InboundMessage, Message, Role, Session, Usage, new_id, utcnow
from bot.ports import PartialSink


@runtime_checkable
class System(Protocol):
    """One step of a turn.

    ``order`` fixes its place (AutoCompaction=18, ContextBuilding=20, ToolLoop=30, MemoryPersist=50,
    Usage=90);
    two systems may not share an order. ``should_process`` lets a system skip a turn cheaply;
    ``process`` does the work. A system that raises is logged and recorded on the turn, and the next
    systems still run, so a failing memory write never costs the user their answer. A system may set
    ``always = True`` to run even when the turn is stopped or times out (``turn.stopped`` is then set).
    A system may also have ``anticipate(message)``: called as a message is accepted, while it is still
    being stored, to start work its turn will need (it must not wait, and must not change anything the
    turn could see: the message may yet be answered together with others, or not at all).

    Example::

        class Echo:
            name, order, enabled = "echo", 40, True

            def should_process(self, turn: Turn) -> bool:
                return turn.reply is None

            async def process(self, turn: Turn) -> None:
                turn.reply = turn.user_text
    """

    name: str
    order: int
    enabled: bool

    def should_process(self, turn: Turn) -> bool: ...

    async def process(self, turn: Turn) -> None: ...


@dataclass(slots=True)
class SystemFailure:
    """A system that raised: ``error`` (type and message) is for the log, ``kind`` lets the reply to
    the user say in plain words what went wrong without showing operator details."""

    system: str
    error: str
    kind: type[Exception] = Exception
    retry_after: float | None = None  # seconds the provider asked us to wait (its Retry-After), if it said


@dataclass
class Turn:
    """What one pipeline run knows.

    - ``inbound``: the user's messages taken together for this turn (collect mode may join several).
    - ``system_prompt`` / ``memory_context``: built by ContextBuilding for the LLM call.
    - ``new_messages``: everything this turn added to the session (user, assistant, tool), in order.
    - ``reply``: the text that goes back to the user; ``None`` means nobody answered yet.
    - ``now``: the turn's own time, the date of its newest message (not the machine's clock: a message
      dated by its platform is remembered at that date); :meth:`clock` runs on from it.
    - ``writes``: durable writes a system started and did not wait for (memory's). The dispatcher waits
      for them beside the session's save, before the reply goes out: they are on disk as surely as if
      the system had waited, and their fsyncs overlap the save's instead of coming one after another.
    """

    session: Session
    inbound: tuple[InboundMessage, ...]
    id: str = field(default_factory=new_id)
    system_prompt: str = ""
    memory_context: str = ""
    reply: str | None = None
    notes: list[str] = field(default_factory=list)  # short user-visible remarks (limits hit, ...)
    new_messages: list[Message] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    failures: list[SystemFailure] = field(default_factory=list)
    on_partial: PartialSink | None = None
    diagnostics: dict[str, Any] = field(default_factory=dict)
    stopped: bool = False  # /stop or the turn timeout cut the turn short
    # The model declined, or had no room left to write: asked again it would do the same, so the chat
    # is told the note as it is, without the failed-turn message's "send another message to try again".
    final_note: bool = False
    now: datetime = field(default_factory=utcnow)
    writes: list[asyncio.Future[Any]] = field(default_factory=list)
    _started: float = field(default_factory=time.monotonic, repr=False)

    def clock(self) -> datetime:
        """The turn's time now: ``now`` plus the time the turn has run."""
        return self.now + timedelta(seconds=time.monotonic() - self._started)

    @property
    def user_text(self) -> str:
        return "\n\n".join(m.text for m in self.inbound if m.text)

    @property
    def channel(self) -> str:
        return self.session.channel

    @property
    def answered(self) -> bool:
        """Whether the model gave an answer: a blank one is none (channels drop or mangle it)."""
        return bool(self.reply and self.reply.strip())

    def own_count(self) -> int:
        """How many of the session's last messages are this turn's: the user messages it answers (all of
        a collected batch) and what it added since. A compaction must keep them: retired, the question
        being answered was gone from the next request, and no memory was made of it."""
        messages = self.session.messages
        start = len(messages) - len(self.new_messages)
        while start > 0 and messages[start - 1].role is Role.USER:
            start -= 1
        return len(messages) - start

    def add_message(self, message: Message) -> None:
        """Append to the session and remember it as this turn's own, stamped with the turn's clock."""
        message.timestamp = self.clock()
        self.session.append(message)
        self.new_messages.append(message)
