"""Tool-call arguments nested too deeply to decode ("[[[[…" from a model repeating itself) are a bad
call the model is told about, never a crash, and the chat goes on.

``json.loads`` raises ``RecursionError`` past about a thousand levels, which is no ``ValueError``: the
tool loop's task crashed, and the call, kept in the session, failed the request of every later turn
(the OpenAI translator decodes each call's arguments), so the chat answered nothing until ``/new``.
Through the real dispatcher, pipeline and model client against the fake model server.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.bot.memory.test_end_to_end import chat
from tests.fakes.llm_server import FakeReply

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize("arguments", ["[" * 5000, '{"zone": ' + "[" * 3000 + "]" * 3000 + "}"])
async def test_arguments_nested_too_deeply_are_a_bad_call_and_the_chat_goes_on(
    tmp_path: Path, arguments: str
) -> None:
    async with chat(tmp_path, memory={"embeddings": "none"}) as bot:
        bot.llm.script(FakeReply(tool_calls=[("time", arguments)]), FakeReply(text="I could not read that."))
        assert await bot.say("what time is it?", NOW) == "I could not read that."
        told = bot.llm.requests[-1].body["messages"][-1]
        assert told["role"] == "tool" and "nested too deeply" in told["content"]
        assert await bot.say("and now?", NOW) == "echo: and now?"
        sent_back = bot.llm.requests[-1].body["messages"]
        calls = [m for m in sent_back if m.get("tool_calls")]
        assert [c["function"]["arguments"] for m in calls for c in m["tool_calls"]] == ["{}"]
        session = await bot.core.sessions.get("test:c1")
        assert session is not None
        kept = [c.arguments for m in session.messages for c in m.tool_calls]
        assert kept == [arguments]  # the session keeps what the model wrote
