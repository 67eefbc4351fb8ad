"""Trimming a request (bot/request_trim.py): what is sent fits the room it is given."""

from __future__ import annotations

import json

from bot.domain import Message, Role, ToolCall
from bot.request_trim import trim_messages
from bot.tokens import TokenCounter


def words(n: int, seed: str) -> str:
    return " ".join(f"{seed}{i % 97}" for i in range(n))


def test_the_last_message_left_is_cut_to_fit_with_its_own_overhead() -> None:
    """The turn's call (a long file written) and its result take more than the room, so they go, and
    the question is all that is left, longer than the room: it was cut to the whole room, its text
    alone, and the request went out over it by the message's own overhead."""
    counter = TokenCounter.offline(model="local-8k", provider="openai")
    call = ToolCall("c1", "files", json.dumps({"path": "notes/a.md", "content": words(600, "w")}))
    messages = [
        Message(Role.ASSISTANT, "", tool_calls=(call,)),
        Message(Role.TOOL, "Wrote it.", tool_call_id="c1", name="files"),
        Message(Role.USER, words(2000, "q")),
    ]
    room = 500

    sent = trim_messages(list(messages), room, counter, keep=3)

    assert [m.role for m in sent] == [Role.USER]
    assert counter.messages_tokens(sent) <= room
