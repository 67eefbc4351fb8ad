"""Tool-call pairs: every tool call is answered right after it, and no result stands without its call.

Both APIs refuse (HTTP 400) a history that breaks this, so a session that got that way once (a turn
cancelled between a call and its result, a crash, an old compaction cut) would fail on every later turn.
The translators therefore send ``paired(messages)``: missing results become a short placeholder, and a
result whose call is gone becomes plain user text, so its content is not lost.
"""

from __future__ import annotations

from collections.abc import Iterable

from bot.domain import Message, Role, ToolCall

MISSING_RESULT = "(no result: the tool call was interrupted before it finished)"


def paired(messages: Iterable[Message]) -> list[Message]:
    """A copy of ``messages`` in which each assistant tool call is followed by exactly one result."""
    out: list[Message] = []
    waiting: dict[str, ToolCall] = {}  # calls of the latest assistant message still owed a result
    orphans: list[Message] = []  # held back until the open calls are answered: results stay adjacent
    for message in messages:
        if message.role is Role.TOOL:
            if message.tool_call_id is not None and message.tool_call_id in waiting:
                del waiting[message.tool_call_id]
                out.append(message)
            else:
                orphans.append(_orphan(message))
            continue
        if waiting or orphans:  # checked here, not in _settle: this loop runs per message per request
            _settle(waiting, orphans, out)
        out.append(message)
        if message.role is Role.ASSISTANT and message.tool_calls:
            waiting = {call.id: call for call in message.tool_calls}
    _settle(waiting, orphans, out)
    return out


def _settle(waiting: dict[str, ToolCall], orphans: list[Message], out: list[Message]) -> None:
    out.extend(Message(Role.TOOL, MISSING_RESULT, tool_call_id=c.id, name=c.name) for c in waiting.values())
    out.extend(orphans)
    waiting.clear()
    orphans.clear()


def _orphan(message: Message) -> Message:
    name = message.name or "a tool"
    return Message(Role.USER, f"[earlier result of {name}]\n{message.content}", timestamp=message.timestamp)
