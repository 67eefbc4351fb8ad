"""Tool-call ids are made unique in the conversation: the first keeps its id, the rest get fresh ones."""

from __future__ import annotations

from bot.domain import Message, Role, ToolCall
from bot.llm.call_ids import unique_calls, used_ids


def test_repeated_blank_and_used_ids_get_fresh_ones_and_the_first_keeps_its_own() -> None:
    history = [
        Message(Role.ASSISTANT, "", tool_calls=(ToolCall("call_0", "f", "{}"),)),
        Message(Role.TOOL, "ok", tool_call_id="call_0", name="f"),
        Message(Role.TOOL, "stray", tool_call_id="call_9", name="f"),
    ]
    assert used_ids(history) == {"call_0", "call_9"}
    calls = tuple(ToolCall(i, "f", "{}") for i in ("a", "a", "", " ", "call_0", "b"))
    ids = [c.id for c in unique_calls(calls, used_ids(history), "toolu_")]
    assert ids[0] == "a" and ids[5] == "b"
    assert all(i.startswith("toolu_") and len(i) == 30 for i in ids[1:5])
    assert len(set(ids)) == 6 and not set(ids) & {"call_0", "call_9"}


def test_unique_ids_are_left_alone() -> None:
    calls = (ToolCall("x", "f", "{}"), ToolCall("y", "g", "{}"))
    assert unique_calls(calls, {"z"}, "call_") == calls
