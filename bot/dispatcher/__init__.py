"""Routes inbound messages to sessions: one turn at a time per session, nothing dropped, nothing twice.

For every session (``<channel>:<chat>``) there is a lane: a queue and at most one running turn.
Messages that arrive during a turn wait in order; when the turn ends, the queued messages are taken
together as the next turn's input (``collect`` mode) or one by one (``per_message``). Commands skip the
queue and are answered at once, even while a slow turn runs; one that must wait for the turn (/new,
/compact) takes its place in the lane, behind the messages sent before it (answered first, in the
conversation they were sent to), and answers later, so it never holds up what the chat sends next (a
/stop). Such a waiting command is kept in the inbox like a message (the chat was told it will run):
after a kill the next start runs it once, in the same place. A command is taken once per platform id,
as a message is: a redelivery is found in the inbox while it waits, or in its session's note of the
commands run there (bot/intake.py), saved with what the command did. Different sessions run concurrently.

The durable path of a message (three fsyncs when it is answered):

1. ``submit`` appends it to the inbox and returns; only then may the channel confirm it to the platform;
2. the turn's messages and its answer are saved in one append of the session log (bot/outbox.py);
3. once the channel confirmed the send, the inbox marks the message done.

A kill at any point leaves the message pending in the inbox, and :meth:`Dispatcher.recover` finishes
it on the next start (bot/recovery.py). A turn the model could not answer for now (down, rate limited,
too slow) is not answered: its messages stay pending and the lane tries it again later, by itself
(bot/model_wait.py). ``recover`` runs before any channel starts; a chat's turns run
once its channel is :meth:`~Dispatcher.ready`, so answers never go to a channel that cannot send yet.

The package's modules, each one concept, pointing one way: ``lanes`` (a chat's queue and its state) ←
``delivery`` (replies through the channel, with the inbox's bookkeeping) ← ``commands`` (taking and
answering commands, and running those that wait in their place in the lane) ← ``arrivals`` (intake:
a message taken once, into the inbox and its chat's lane); ``turns`` (a lane's worker and its turns,
worded by ``replies``) ← ``dispatcher`` (recovery, shutdown, and what commands may do). Other layers use
:class:`Dispatcher` and :class:`TurnObserver` only.
"""

from bot.dispatcher.dispatcher import Dispatcher
from bot.dispatcher.turns import TurnObserver

__all__ = ["Dispatcher", "TurnObserver"]
