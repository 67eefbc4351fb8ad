"""Chat commands: recognized before the pipeline, answered at once, never sent to the LLM.

The router only parses and dispatches; it answers /help and /stop itself. The other handlers are plain
async functions registered by the composition root: /status, /compact and /new live in
``bot.commands.session``, next to the services they report on.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from bot.commands.session import Admins, SessionCommands
from bot.domain import InboundMessage

__all__ = ["Admins", "CommandCall", "CommandHandler", "CommandRouter", "SessionCommands", "SessionControl"]

_COMMAND = re.compile(r"^/([A-Za-z][A-Za-z0-9_]{0,31})(?:@([A-Za-z0-9_]+))?(?:\s+(.*))?$", re.DOTALL)


class SessionControl(Protocol):
    """What the dispatcher lets commands see and do for a session."""

    def is_running(self, sid: str) -> bool: ...

    def answer_on_its_way(self, sid: str) -> bool:
        """Whether a turn's answer is final (the model gave it, or the pipeline ended) and still being
        saved or sent: it is no longer running (``is_running``), and /stop leaves it to arrive."""

    def queue_depth(self, sid: str) -> int: ...

    def model_wait(self, sid: str) -> float | None:
        """Seconds until the answers waiting for the model are tried again; ``None`` if none wait."""

    def storage_wait(self, sid: str) -> str | None:
        """What of the chat waits for storage to take it (a full disk holds its answer's save, say),
        or ``None``: the chat goes on by itself once the write goes through."""

    async def save_through(
        self, to: InboundMessage, what: str, write: Callable[[], Awaitable[object]], *, notice: str
    ) -> None:
        """Do a command's ``write`` to storage (``what``: ``"new_save"``, say); while storage refuses it,
        write again with growing pauses until it goes through, as a turn's save is (``storage_wait``
        tells of it meanwhile; a shutdown cancels the wait). The chat is told ``notice`` once, when the
        command is kept in the inbox: a kill meanwhile then leaves it for the next start to run."""

    async def stop(self, sid: str) -> int | None:
        """Cancel the running turn, or the wait for the model; ``None`` if there was neither, else how
        many queued (or waiting) messages were kept."""

    def exclusive(self, sid: str) -> AbstractAsyncContextManager[None]:
        """Wait for the running turn to end, and for the messages queued before the command to be
        answered, and keep new turns out while held (for /compact, /new). A command that has to wait is
        kept durably meanwhile: a restart runs it, once, in the same place."""


@dataclass(frozen=True, slots=True)
class CommandCall:
    name: str
    args: str
    message: InboundMessage

    @property
    def session_id(self) -> str:
        return self.message.session_id


CommandHandler = Callable[[CommandCall, SessionControl], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class _Command:
    description: str
    handler: CommandHandler


class CommandRouter:
    """Maps ``/name args`` (also ``/name@BotName args``) to handlers; ``/help`` lists them."""

    def __init__(self) -> None:
        self._commands: dict[str, _Command] = {}
        self._own: dict[str, list[tuple[str, str]]] = {}  # channel -> commands it answers itself
        self.add("help", "Show the commands", self._help)
        self.add("stop", "Stop the running reply", _stop)

    def add(self, name: str, description: str, handler: CommandHandler) -> None:
        self._commands[name.lower()] = _Command(description, handler)

    def add_own(self, channel: str, name: str, description: str) -> None:
        """A command ``channel`` answers itself (the terminal's /quit): /help lists it in that channel's
        chats only; it never reaches the router, nor a platform's command menu (:attr:`commands`)."""
        self._own.setdefault(channel, []).append((name.lower(), description))

    @property
    def commands(self) -> list[tuple[str, str]]:
        """(name, description) pairs, for /help and the platforms' command menus."""
        return [(name, c.description) for name, c in self._commands.items()]

    def parse(self, message: InboundMessage) -> CommandCall | None:
        """A command call if the text is command-shaped (``/usr/bin`` is not), else ``None``. One that
        names a bot (``/stop@OtherBot``) is another bot's: channels take their own name off first."""
        match = _COMMAND.match(message.text.strip())
        if match is None or match.group(2):
            return None
        return CommandCall(match.group(1).lower(), (match.group(3) or "").strip(), message)

    async def handle(self, call: CommandCall, control: SessionControl) -> str:
        command = self._commands.get(call.name)
        if command is None:
            return f"Unknown command /{call.name}. Send /help for the list."
        return await command.handler(call, control)

    async def _help(self, call: CommandCall, control: SessionControl) -> str:
        lines = ["Commands:"]
        own = self._own.get(call.message.channel, [])
        lines += [f"/{name} — {description}" for name, description in [*self.commands, *own]]
        return "\n".join(lines)


async def _stop(call: CommandCall, control: SessionControl) -> str:
    waiting = control.model_wait(call.session_id) is not None
    kept = await control.stop(call.session_id)
    if kept is None and control.answer_on_its_way(call.session_id):
        return "Nothing to stop: the answer is already on its way."
    if kept is None:
        return "Nothing is running."
    if waiting:
        plural = "message is" if kept == 1 else "messages are"
        return (
            f"⏹ Stopped waiting for the AI model: your {kept} waiting {plural} kept in the history, "
            "unanswered; your next message starts a new turn."
        )
    if kept:
        plural = "message" if kept == 1 else "messages"
        return f"⏹ Stopped. {kept} queued {plural} kept in the history; your next message starts a new turn."
    return "⏹ Stopped."
