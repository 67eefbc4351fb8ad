"""A chat's lane: its queue of work in order, its running turn and the state a turn leaves behind.

The lane is plain state, shared by the parts of the dispatcher that act on it: intake appends to the
queue (bot/dispatcher/arrivals.py), as does a command that waits for the turn
(bot/dispatcher/commands.py); the lane's worker takes work off its head and runs it
(bot/dispatcher/turns.py), and delivery keeps the answers the platform would not take
(bot/dispatcher/delivery.py). Everything here runs on the event loop; ``lock`` is held while a turn or a
command that waits for the turn (:meth:`~bot.dispatcher.Dispatcher.exclusive`) has the lane.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from bot.commands import CommandCall
from bot.domain import InboundMessage, Session
from bot.model_wait import ModelWait
from bot.outbox import PendingReply
from pipeline import Turn


@dataclass(slots=True)
class Queued:
    """A message waiting for its turn, with the inbox entries that are done once it is answered."""

    message: InboundMessage
    entries: list[str] = field(default_factory=list)  # its inbox entry ids
    in_session: bool = False  # recovered after a turn that saved it: the session holds it already
    # Messages answered in its turn, each as its own message (its sender, its platform id, its inbox
    # entry), never merged into its text: those that arrived past the queue limit, folded behind it, and
    # those a turn cut short answered with it (see :func:`one_turn`).
    folded: list[Queued] = field(default_factory=list)
    # A /stop kept it, but it came after a command still waiting (a /new): it goes into the history
    # unanswered in its place, after that command ran, not before it (see :func:`take_messages`).
    unanswered: bool = False

    def messages(self) -> list[Queued]:
        """It and the messages folded behind it, in the order they came."""
        return [self, *self.folded]


@dataclass(eq=False, slots=True)
class Command:
    """A command being answered (by ``task``). One that waits for its chat's lane
    (:meth:`Dispatcher.exclusive`) is queued behind what the chat sent before it and sets ``placed``;
    it is kept in the inbox from then on (``entry``, durable once ``durable`` is done) until it ran, so
    the next start runs it, in the same place, should this run end first. The lane's worker sets
    ``reached`` when its place comes. ``noted``: the session that notes it as run (bot/intake.py)."""

    call: CommandCall
    task: asyncio.Task[None]
    placed: asyncio.Event = field(default_factory=asyncio.Event)
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    entry: str | None = None
    durable: asyncio.Task[None] | None = None
    noted: Session | None = None
    # Set once it ran, kept in the inbox: it still holds its lane until its reply is kept there too.
    unlock: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class KeptCommand:
    """A command that waited for its chat's lane when the last run ended (see :class:`Command`): the
    lane's worker runs it in its place, after what was sent before it."""

    call: CommandCall
    entry: str


@dataclass(slots=True)
class Stop:
    """A /stop of the running turn: its batch and the queued messages it keeps in the history. The lane's
    worker does that bookkeeping as soon as the turn ended, before anything else takes the lane (a
    command waiting for the turn, or a message that arrived meanwhile), so the kept messages are in
    the history before them; ``done`` tells /stop it was done."""

    stopped: list[Queued]
    kept: list[Queued]
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass(slots=True)
class Lane:
    """One chat's queue and at most one running turn (see the package doc)."""

    channel: str
    chat_id: str
    # Work in the order the chat sent it; a reply here is one saved before a restart, to send again.
    queue: deque[Queued | PendingReply | KeptCommand | Command] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    intake: asyncio.Lock = field(default_factory=asyncio.Lock)  # keeps arrival order through dedup
    worker: asyncio.Task[None] | None = None
    turn: asyncio.Task[None] | None = None
    batch: list[Queued] = field(default_factory=list)  # what the running turn answers
    # The running turn, and whether its pipeline ended (with its answer, an apology or a timeout's note):
    # they tell when its answer is final (see :func:`answer_final`).
    answering: Turn | None = None
    answered: bool = False
    overflow_noticed: bool = False
    stopping: Stop | None = None  # what /stop asked of the running turn; the worker does it
    # Answers not delivered (refused for good, or past the patience), kept in the inbox: each is tried
    # once more before the chat's next answer, so an unblocked chat gets them in order.
    set_aside: list[PendingReply] = field(default_factory=list)
    # The model was out of reach: the failed turn's messages are back at the head of the queue, and the
    # worker waits for the next try (bot/model_wait.py).
    model_wait: ModelWait | None = None


def answer_final(lane: Lane) -> bool:
    """Whether the running turn's answer is final: the model gave it, or the pipeline ended. From then on
    the history holds it (memory too) and it is saved and sent: /stop does not take it back, and the
    turn counts as over for /status. A /stop that cut it short there left the answer in the history
    while the chat was sent part of it, or nothing, and never again (its messages were done)."""
    turn = lane.answering
    return lane.answered or (turn is not None and turn.answered)


def take_messages(lane: Lane) -> tuple[list[Queued], int]:
    """What /stop keeps in the history unanswered: the queued messages before the first waiting command,
    taken out of the queue, and how many more come after it, marked ``unanswered`` and left in their
    place: a /new that waits must not clear what the chat sent after it (it belongs to the fresh
    conversation)."""
    taken: list[Queued] = []
    rest: deque[Queued | PendingReply | KeptCommand | Command] = deque()
    later = 0
    behind_command = False
    for item in lane.queue:
        if isinstance(item, KeptCommand | Command):
            behind_command = True
        elif isinstance(item, Queued) and behind_command:
            item.unanswered = True
            later += len(item.messages())
        elif isinstance(item, Queued):
            taken.extend(item.messages())
            continue
        rest.append(item)
    lane.queue = rest
    return taken, later


def take_unanswered(lane: Lane) -> list[Queued]:
    """The ``unanswered`` messages at the head of the queue, taken out (see :func:`take_messages`)."""
    taken: list[Queued] = []
    while lane.queue and isinstance(head := lane.queue[0], Queued) and head.unanswered:
        lane.queue.popleft()
        taken.extend(head.messages())
    return taken


def one_turn(batch: list[Queued]) -> Queued:
    """``batch`` (a turn's messages, oldest first) as one queued item: its first message with the others
    folded behind it. A try the model missed goes back into the queue so, and is tried again as one
    turn, in ``per_message`` mode too (as a restart takes the messages a cut turn stored:
    ``Dispatcher.recover``): one answer per message answered the same history, which holds them all,
    once per message."""
    head, *rest = batch
    for queued in batch:
        queued.folded = []
    head.folded = rest
    return head


def queued_count(lane: Lane) -> int:
    """Messages (folded ones included) and commands waiting in the lane."""
    return sum(len(q.messages()) if isinstance(q, Queued) else 1 for q in lane.queue)


def messages_ahead(lane: Lane, command: Command) -> int:
    """Messages (folded ones included) queued before ``command``: answered before it runs."""
    ahead = 0
    for item in lane.queue:
        if item is command:
            break
        if isinstance(item, Queued):
            ahead += len(item.messages())
    return ahead


def next_command(lane: Lane) -> KeptCommand | Command | None:
    """The waiting command to run now, taken out of the queue: the one at its head or, while the chat
    waits for the model, the first one queued (a command does not wait for the model: it runs between
    the tries, as it would before a restart)."""
    head = lane.queue[0]
    if isinstance(head, KeptCommand | Command):
        lane.queue.popleft()
        return head
    if lane.model_wait is not None:
        for item in lane.queue:
            if isinstance(item, KeptCommand | Command):
                lane.queue.remove(item)
                return item
    return None
