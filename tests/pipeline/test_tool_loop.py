"""ToolLoopSystem end to end: the real LLMClient against the fake server, in both wire formats."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.catalog import load_catalog
from bot.commands import CommandRouter
from bot.compaction import CompactionService
from bot.config import CompactionSettings, DispatcherSettings, LLMSettings, ToolSettings
from bot.context_budget import ContextBudget
from bot.dispatcher import Dispatcher
from bot.dispatcher.replies import reply_text
from bot.domain import InboundMessage, Message, Role, Session
from bot.errors import LLMContextOverflow
from bot.inbox import Inbox
from bot.llm import LLMClient
from bot.session_service import SessionService
from bot.sessions import JsonSessionStore
from bot.tokens import TokenCounter
from bot.tools import ToolContext, ToolError, ToolRegistry, builtin_tools
from pipeline import Pipeline
from pipeline.base import Turn
from pipeline.tool_calls import CANCELLED, NOT_RUN, cap
from pipeline.tool_loop import (
    ANSWER_NOW,
    CUT_SHORT,
    DECLINED,
    DECLINED_PART,
    LAST_CALL,
    MAX_CALLS_PER_ANSWER,
    NO_ROOM,
    TOO_MANY_CALLS,
    ToolLoopSystem,
)
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.recording import RecordingChannel, SlowTool
from tests.session_kit import RecordingRetirer, conversation

APIS = ["openai", "anthropic"]
MODELS = {"openai": "gpt-4.1-mini", "anthropic": "claude-haiku-4-5"}
CATALOG = load_catalog()


# ---- honest tools -----------------------------------------------------------------------------------

NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}}
ADD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


class AddTool:
    name = "add"
    description = "Add two integers."
    parameters = ADD_SCHEMA

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.active = 0
        self.peak = 0

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        a, b = args.get("a"), args.get("b")
        if not isinstance(a, int) or not isinstance(b, int):
            raise ToolError("a and b must be integers")
        self.calls.append(args)
        self.active += 1
        self.peak = max(self.peak, self.active)
        for _ in range(3):  # yield so that concurrently started calls overlap
            await asyncio.sleep(0)
        self.active -= 1
        return str(a + b)


class BigTool:
    name = "big"
    description = "Return a lot of text."
    parameters = NO_ARGS

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return "H" * 30_000 + "T" * 30_000


class TickTool:
    """Advances a fake clock, so a deadline passes without waiting for it."""

    name = "tick"
    description = "Let time pass."
    parameters = NO_ARGS

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        self.clock.now += 1000.0
        return "tick"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# ---- set-up -----------------------------------------------------------------------------------------


def llm_client(server: FakeLLMServer, http: httpx.AsyncClient, api: str, **values: Any) -> LLMClient:
    settings = LLMSettings.model_validate(
        {
            "model": MODELS[api],
            "openai": {"base_url": server.openai_base_url, "api_key": "sk-test-openai"},
            "anthropic": {"base_url": server.anthropic_base_url, "api_key": "sk-ant-test"},
            "timeout": 10.0,
            "max_retries": 0,
            **values,
        }
    )
    return LLMClient(settings, CATALOG, http)


def tool_settings(**values: Any) -> ToolSettings:
    names = ["add", "slow", "big", "tick"]
    return ToolSettings.model_validate({"enabled": names, **values})


def new_turn(text: str = "please compute", session: Session | None = None) -> Turn:
    session = session or Session.new("test", "chat")
    inbound = InboundMessage("test", "chat", "u1", text)
    session.append(Message(Role.USER, text))  # the dispatcher stores the user's message before the pipeline
    return Turn(session=session, inbound=(inbound,), system_prompt="You are a test bot.")


def loop_for(
    server: FakeLLMServer,
    http: httpx.AsyncClient,
    api: str,
    tools: list[Any],
    settings: ToolSettings | None = None,
    **kwargs: Any,
) -> ToolLoopSystem:
    settings = settings or tool_settings()
    return ToolLoopSystem(llm_client(server, http, api), ToolRegistry(tools, settings), settings, **kwargs)


def assert_paired(session: Session) -> None:
    """Every tool call id is answered by exactly one tool result right after its assistant message."""
    messages = session.messages
    for i, message in enumerate(messages):
        if message.role is Role.ASSISTANT and message.tool_calls:
            ids = [c.id for c in message.tool_calls]
            following = messages[i + 1 : i + 1 + len(ids)]
            assert [m.role for m in following] == [Role.TOOL] * len(ids)
            assert [m.tool_call_id for m in following] == ids
    answered = [m.tool_call_id for m in messages if m.role is Role.TOOL]
    assert len(answered) == len(set(answered))


def tool_results(session: Session) -> list[str]:
    return [m.content for m in session.messages if m.role is Role.TOOL]


# ---- the loop ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
async def test_multi_step_loop_feeds_results_back(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    add = AddTool()
    server.script(
        FakeReply(text="Let me add.", tool_calls=[("add", {"a": 1, "b": 2})]),
        FakeReply(tool_calls=[("add", {"a": 3, "b": 4})]),
        FakeReply(text="The sums are 3 and 7."),
    )
    turn = new_turn()
    await loop_for(server, http, api, [add]).process(turn)

    assert turn.reply == "The sums are 3 and 7."
    assert turn.notes == []
    assert [m.role for m in turn.session.messages] == [
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]
    assert tool_results(turn.session) == ["3", "7"]
    assert turn.new_messages == turn.session.messages[1:]
    assert turn.usage.calls == 3
    assert_paired(turn.session)
    # The model received the tools and, on the last call, both results in its own wire format.
    first, last = server.requests[0].body, server.requests[-1].body
    names = [t["function"]["name"] if api == "openai" else t["name"] for t in first["tools"]]
    assert names == ["add"]
    assert '"7"' in json.dumps(last["messages"]) or "7" in json.dumps(last["messages"])
    assert len(server.requests) == 3


@pytest.mark.parametrize("api", APIS)
async def test_a_call_of_an_answer_cut_off_at_the_output_limit_is_never_run(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    """Its arguments may lack their end and still parse (a "write" with half a report): the model is
    told why it did not run, and calls again."""
    add = AddTool()
    server.script(
        FakeReply(tool_calls=[("add", {"a": 1, "b": 2})], cut_off=True),
        FakeReply(tool_calls=[("add", {"a": 1, "b": 20})]),
        FakeReply(text="The sum is 21."),
    )
    turn = new_turn()
    await loop_for(server, http, api, [add]).process(turn)

    assert add.calls == [{"a": 1, "b": 20}]
    assert tool_results(turn.session) == [CUT_SHORT, "21"] and turn.reply == "The sum is 21."
    assert turn.notes == ["Some tool calls were not run: the model's answer was cut off at its output limit."]
    assert_paired(turn.session)


@pytest.mark.parametrize("api", APIS)
async def test_parallel_calls_run_concurrently_up_to_the_bound(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    add = AddTool()
    calls = [("add", {"a": i, "b": 1}) for i in range(4)]
    server.script(FakeReply(tool_calls=calls), FakeReply(text="done"))
    turn = new_turn()
    await loop_for(server, http, api, [add], tool_settings(max_parallel=2)).process(turn)

    assert turn.reply == "done"
    assert add.peak == 2  # concurrent, and never more than max_parallel
    assert tool_results(turn.session) == ["1", "2", "3", "4"]  # results keep the call order
    assert_paired(turn.session)


@pytest.mark.parametrize("api", APIS)
async def test_bad_arguments_and_unknown_tools_are_errors_the_model_reads(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    server.script(
        FakeReply(tool_calls=[("add", {"a": "one", "b": 2}), ("nope", {})]),
        FakeReply(tool_calls=[("add", {"a": 1, "b": 2})]),
        FakeReply(text="fixed: 3"),
    )
    turn = new_turn()
    await loop_for(server, http, api, [AddTool()]).process(turn)

    assert turn.reply == "fixed: 3"
    results = tool_results(turn.session)
    assert results[0] == "Error: a and b must be integers"
    assert results[1].startswith("Error: there is no tool named 'nope'. Available tools: add")
    assert results[2] == "3"
    assert_paired(turn.session)


@pytest.mark.parametrize("stream", [False, True])
async def test_invalid_json_arguments_are_answered_not_crashed_on(
    server: FakeLLMServer, http: httpx.AsyncClient, stream: bool
) -> None:
    """OpenAI sends arguments as a JSON string that may be broken (Anthropic sends an object)."""
    server.script(
        FakeReply(tool_calls=[("add", '{"a": 1, "b": '), ("add", "[1, 2]")]),
        FakeReply(text="All done now."),
    )
    turn = new_turn()
    if stream:
        turn.on_partial = Sink()
    await loop_for(server, http, "openai", [AddTool()]).process(turn)

    assert turn.reply == "All done now."
    first, second = tool_results(turn.session)
    assert first.startswith("Error: the arguments are not valid JSON (Expecting value at position 14)")
    assert second == "Error: the arguments must be a JSON object."
    assert_paired(turn.session)


async def test_broken_arguments_in_the_history_do_not_get_the_chat_refused(http: httpx.AsyncClient) -> None:
    """vLLM, llama-server, SGLang and Ollama parse every earlier call's arguments for the chat template
    and refuse the whole request when they are no JSON object: sent back as the model wrote them, one
    broken call made the rest of the turn and every later turn of the chat fail."""
    async with FakeLLMServer(strict_template=True) as local:
        local.script(
            FakeReply(tool_calls=[("add", '{"a": 1, "b": '), ("add", "[1, 2]")]),
            FakeReply(text="All done now."),
        )
        system = loop_for(local, http, "openai", [AddTool()])
        turn = new_turn()
        await system.process(turn)
        assert turn.reply == "All done now."
        follow_up = new_turn("and now?", session=turn.session)
        await system.process(follow_up)
        assert follow_up.reply == "echo: and now?"
        sent = local.requests[-1].body["messages"][2]["tool_calls"]
        assert [c["function"]["arguments"] for c in sent] == ["{}", "{}"]
    # What the model wrote stays in the session: only what is sent is made acceptable.
    assert [c.arguments for c in turn.session.messages[1].tool_calls] == ['{"a": 1, "b": ', "[1, 2]"]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_call_without_a_name_does_not_get_the_chat_refused(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str, stream: bool
) -> None:
    """A model that sends a tool call with an empty name (a local model's broken call): its result says
    no such tool ran. Sent back as it was, both APIs refused the request for the missing name, so the
    rest of the turn and every later turn of the chat failed."""
    server.script(FakeReply(tool_calls=[("", {"a": 1, "b": 2})]), FakeReply(text="All done now."))
    system = loop_for(server, http, api, [AddTool()])
    turn = new_turn()
    shown: list[str] = []

    async def sink(text: str) -> None:
        shown.append(text)

    turn.on_partial = sink if stream else None
    await system.process(turn)
    assert turn.reply == "All done now." and not turn.failures
    assert tool_results(turn.session)[0].startswith("Error: there is no tool named ''.")
    follow_up = new_turn("and now?", session=turn.session)
    await system.process(follow_up)
    assert follow_up.reply == "echo: and now?"
    assert_paired(turn.session)
    # What the model wrote stays in the session: only what is sent is made acceptable.
    assert turn.session.messages[1].tool_calls[0].name == ""


class NoTextTool:
    """A tool that breaks its contract: it returns a value that is not text."""

    name = "notext"
    description = "Return nothing useful."
    parameters = NO_ARGS

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return {"rows": 3} if args.get("dict") else None


class Outcomes:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def tool_call(self, name: str, outcome: str) -> None:
        self.seen.append((name, outcome))


@pytest.mark.parametrize("api", APIS)
async def test_a_tool_that_returns_no_text_is_a_failed_call(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    """Its value used to fail as the result was stored: the model read that the turn deadline had passed
    (it had not), and the metrics counted the call as ok."""
    server.script(
        FakeReply(tool_calls=[("notext", {}), ("notext", {"dict": True}), ("add", {"a": 1, "b": 1})]),
        FakeReply(text="ok"),
    )
    outcomes = Outcomes()
    turn = new_turn()
    settings = tool_settings(enabled=["notext", "add"])
    await loop_for(server, http, api, [NoTextTool(), AddTool()], settings, observer=outcomes).process(turn)

    assert turn.reply == "ok" and turn.notes == []
    failed = "Error: notext failed unexpectedly (it returned no text)."
    assert tool_results(turn.session) == [failed, failed, "2"]
    assert sorted(outcomes.seen) == [("add", "ok"), ("notext", "crashed"), ("notext", "crashed")]


ECHO_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"text": {"type": "string"}}}


class EchoTool:
    name = "echo"
    description = "Say the text back."
    parameters = ECHO_SCHEMA

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return f"{args['text']} ({len(args['text'].encode('utf-8'))} bytes)"


@pytest.mark.parametrize("api", APIS)
async def test_a_lone_surrogate_escaped_in_the_arguments_reaches_the_tool_replaced(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    """``"\\ud83d"`` (half an emoji) is valid JSON and plain ASCII: only decoded is it a lone surrogate,
    which no tool could write as UTF-8."""
    server.script(FakeReply(tool_calls=[("echo", {"text": "Zo\ud83d"})]), FakeReply(text="ok"))
    turn = new_turn()
    await loop_for(server, http, api, [EchoTool()], tool_settings(enabled=["echo"])).process(turn)

    assert tool_results(turn.session) == ["Zo\ufffd (5 bytes)"]
    assert turn.reply == "ok"


class ListingTool:
    name = "listing"
    description = "List a folder."
    parameters = NO_ARGS

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return "caf\udce9.txt"  # os.scandir's name for a Latin-1 "café.txt"


@pytest.mark.parametrize("api", APIS)
async def test_a_lone_surrogate_in_a_tool_result_never_reaches_a_request(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    """Stored as is, it made this request and every later one of the chat fail to encode."""
    server.script(FakeReply(tool_calls=[("listing", {})]), FakeReply(text="one file"))
    turn = new_turn()
    await loop_for(server, http, api, [ListingTool()], tool_settings(enabled=["listing"])).process(turn)

    assert turn.reply == "one file" and not turn.failures
    assert tool_results(turn.session) == ["caf\ufffd.txt"]


@pytest.mark.parametrize("api", APIS)
async def test_an_answer_cut_at_the_output_limit_says_so(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    server.script(FakeReply(text="The three steps are: first, open the", cut_off=True))
    turn = new_turn()
    await loop_for(server, http, api, []).process(turn)
    assert turn.reply == "The three steps are: first, open the"
    assert turn.notes == ["The answer was cut off at the model's output limit: ask me to go on."]


@pytest.mark.parametrize(("api", "stop"), [("anthropic", "refusal"), ("openai", "content_filter")])
@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_the_model_declined_to_finish_says_so(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str, stop: str, stream: bool
) -> None:
    """Anthropic's ``stop_reason: refusal`` and OpenAI's (or Azure's) ``finish_reason: content_filter``
    end an answer the model will not give, often after some text: sent as if whole, the chat could not
    tell that it stopped short, and with no text it read "the model returned an empty answer"."""
    server.script(FakeReply(text="Here is how you", stop=stop))
    turn = new_turn()
    turn.on_partial = Sink() if stream else None
    await loop_for(server, http, api, [AddTool()]).process(turn)
    assert turn.reply == "Here is how you" and turn.notes == [DECLINED_PART]

    server.script(FakeReply(stop=stop))
    blank = new_turn("and this?", session=turn.session)
    blank.on_partial = Sink() if stream else None
    await loop_for(server, http, api, [AddTool()]).process(blank)
    assert blank.reply == "" and blank.notes == [DECLINED]
    # Told as it is: "Sorry, I couldn't answer this time (… this.). … send another message to try
    # again" read badly, and asking again meets the same refusal.
    assert reply_text(blank) == (f"⚠️ {DECLINED}", True)


@pytest.mark.parametrize("api", APIS)
async def test_a_blank_answer_cut_off_at_the_output_limit_says_so(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A reasoning model that spent ``max_tokens`` on thinking answers nothing, cut off at the limit: the
    chat read "the model returned an empty answer", and the log had no word of the limit to raise."""
    server.script(FakeReply(text="", cut_off=True))
    turn = new_turn()
    await loop_for(server, http, api, [AddTool()]).process(turn)
    assert turn.reply == "" and turn.notes == [NO_ROOM] and len(server.requests) == 1
    assert reply_text(turn) == (f"⚠️ {NO_ROOM}", True)  # asking again would end the same way
    [logged] = [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("fix")]
    assert "MEMBOT_LLM__MAX_OUTPUT_TOKENS" in str(logged["fix"])


@pytest.mark.parametrize("stream", [False, True])
async def test_an_openai_refusal_is_the_answer_streamed_or_not(
    server: FakeLLMServer, http: httpx.AsyncClient, stream: bool
) -> None:
    """OpenAI sends a refusal in ``refusal``, not ``content``: a whole answer showed it, a streamed one
    (``delta.refusal``) lost it, and the chat read "the model returned an empty answer"."""
    server.script(FakeReply(refusal="I can't help with that request."))
    turn = new_turn()
    sink = Sink()
    turn.on_partial = sink if stream else None
    await loop_for(server, http, "openai", []).process(turn)
    assert turn.reply == "I can't help with that request."
    assert turn.notes == []  # (it says so itself)
    assert not stream or sink.shown[-1] == "I can't help with that request."


class Sink:
    def __init__(self) -> None:
        self.shown: list[str] = []

    async def __call__(self, text: str) -> None:
        self.shown.append(text)


@pytest.mark.parametrize("api", APIS)
async def test_streaming_shows_partial_text(server: FakeLLMServer, http: httpx.AsyncClient, api: str) -> None:
    server.script(
        FakeReply(text="Working on it", tool_calls=[("add", {"a": 1, "b": 1})]),
        FakeReply(text="All done now, the answer is 2."),
    )
    sink = Sink()
    turn = new_turn()
    turn.on_partial = sink
    await loop_for(server, http, api, [AddTool()]).process(turn)

    assert turn.reply == "All done now, the answer is 2."
    assert tool_results(turn.session) == ["2"]
    assert "Working on it" in sink.shown
    assert sink.shown[-1] == "All done now, the answer is 2."
    assert len(sink.shown) > 2  # more than one update per answer: it really streamed
    assert all(r.body.get("stream") for r in server.requests)


# ---- empty answers ----------------------------------------------------------------------------------


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


async def chat_answer(system: ToolLoopSystem, tmp_path: Path) -> str:
    """What the user reads: the loop behind the real dispatcher, one question, the one reply sent."""
    sessions = SessionService(JsonSessionStore(tmp_path / "sessions"))
    dispatcher = Dispatcher(
        Pipeline([system]), sessions, CommandRouter(), DispatcherSettings(), inbox=Inbox(tmp_path / "inbox")
    )
    channel = RecordingChannel(dispatcher.submit)
    dispatcher.attach(channel)
    await dispatcher.submit(InboundMessage("test", "chat", "u1", "what is 1 + 2?"))
    [reply] = await channel.wait_for(1)
    return reply.text


@pytest.mark.parametrize("blank", ["", " \n "])
@pytest.mark.parametrize("api", APIS)
async def test_an_empty_answer_after_tools_is_asked_for_once_more(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str, blank: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Local models often end a turn with nothing after reading a tool result. The user got "Sorry, I
    couldn't answer this time (the model returned an empty answer)" for an empty one, and a blank
    message for one of whitespace (Telegram showed "(empty reply)", Discord sent nothing at all)."""
    server.script(
        FakeReply(tool_calls=[("add", {"a": 1, "b": 2})]), FakeReply(text=blank), FakeReply(text="It is 3.")
    )
    turn = new_turn()
    await loop_for(server, http, api, [AddTool()]).process(turn)

    assert turn.reply == "It is 3." and turn.notes == []
    # One more call, told that a plain answer is needed now; the blank answer is not kept in the history.
    assert [ANSWER_NOW in json.dumps(r.body) for r in server.requests] == [False, False, True]
    assert [m.role for m in turn.session.messages] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    assert_paired(turn.session)
    [line] = logged(caplog, "empty_answer")
    assert line["action"] == "asked again" and line["llm_calls"] == 2


@pytest.mark.parametrize("blank", ["", " \n "])
@pytest.mark.parametrize("api", APIS)
async def test_two_empty_answers_after_tools_get_the_failed_turn_fallback(
    server: FakeLLMServer,
    http: httpx.AsyncClient,
    api: str,
    blank: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server.script(
        FakeReply(tool_calls=[("add", {"a": 1, "b": 2})]), FakeReply(text=blank), FakeReply(text=blank)
    )
    text = await chat_answer(loop_for(server, http, api, [AddTool()]), tmp_path)

    assert text == (
        "⚠️ Sorry, I couldn't answer this time (the model returned an empty answer). "
        "Your message is saved — send another message to try again."
    )
    assert len(server.requests) == 3  # asked once more, not again and again
    assert [line["action"] for line in logged(caplog, "empty_answer")] == ["asked again", "fallback"]


@pytest.mark.parametrize("api", APIS)
async def test_no_extra_call_for_an_empty_answer_past_the_model_call_limit(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    server.script(FakeReply(tool_calls=[("add", {"a": 1, "b": 2})]), FakeReply(text=" \n "))
    turn = new_turn()
    await loop_for(server, http, api, [AddTool()], tool_settings(max_llm_calls=2)).process(turn)

    assert len(server.requests) == 2
    assert turn.reply == ""  # not a blank message: the dispatcher sends its failed-turn fallback
    [line] = logged(caplog, "empty_answer")
    assert line["action"] == "fallback" and line["llm_calls"] == 2


# ---- tool-call ids ----------------------------------------------------------------------------------


def sent_calls(api: str, body: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]]]:
    """The call ids of a request in order, and its results as ``(the id answered, text)`` in order."""
    calls: list[str] = []
    results: list[tuple[str, str]] = []
    for message in body["messages"]:
        if api == "openai":
            calls += [c["id"] for c in message.get("tool_calls") or ()]
            if message["role"] == "tool":
                results.append((message["tool_call_id"], message["content"]))
        elif isinstance(message["content"], list):
            for block in message["content"]:
                if block["type"] == "tool_use":
                    calls.append(block["id"])
                elif block["type"] == "tool_result":
                    results.append((block["tool_use_id"], block["content"]))
    return calls, results


def call_ids(session: Session) -> list[str]:
    return [c.id for m in session.messages for c in m.tool_calls]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", APIS)
async def test_repeated_tool_call_ids_get_one_result_each(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """llama-server, Ollama and some vLLM versions send one id for two calls of an answer, or start at
    ``call_0`` in every answer. The first result was sent as the answer to both calls and the second as
    plain user text (OpenAI); Anthropic refuses a request with an id twice ("`tool_use` ids must be
    unique")."""
    add = AddTool()
    server.script(
        FakeReply(tool_calls=[("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})], call_ids=["call_0"] * 2),
        FakeReply(tool_calls=[("add", {"a": 5, "b": 6})], call_ids=["call_0"]),
        FakeReply(text="3, 7 and 11."),
    )
    turn = new_turn()
    if stream:
        turn.on_partial = Sink()
    await loop_for(server, http, api, [add]).process(turn)

    assert turn.reply == "3, 7 and 11." and turn.failures == []
    assert len(add.calls) == 3
    ids = call_ids(turn.session)
    assert ids[0] == "call_0" and len(set(ids)) == 3  # the first keeps its id, the others get new ones
    assert_paired(turn.session)
    calls, results = sent_calls(api, server.requests[-1].body)
    assert calls == ids and [answered for answered, _ in results] == ids
    assert [text for _, text in results] == ["3", "7", "11"]  # each result answers its own call
    assert [line["replaced"] for line in logged(caplog, "tool_call_ids_replaced")] == [["call_0"], ["call_0"]]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", APIS)
async def test_tool_calls_without_an_id_get_one(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str, stream: bool
) -> None:
    """A call sent with no id, or an empty one: Anthropic's answer was refused as malformed, and an
    empty id made the next request fail (both APIs need one to pair the result with)."""
    server.script(
        FakeReply(tool_calls=[("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})], call_ids=[None, ""]),
        FakeReply(tool_calls=[("add", {"a": 5, "b": 6})], call_ids=[None]),
        FakeReply(text="3, 7 and 11."),
    )
    turn = new_turn()
    if stream:
        turn.on_partial = Sink()
    await loop_for(server, http, api, [AddTool()]).process(turn)

    assert turn.reply == "3, 7 and 11." and turn.failures == []
    ids = call_ids(turn.session)
    prefix = "toolu_" if api == "anthropic" else "call_"
    assert len(set(ids)) == 3 and all(i.startswith(prefix) and len(i) > len(prefix) for i in ids)
    assert_paired(turn.session)
    calls, results = sent_calls(api, server.requests[-1].body)
    assert calls == ids and results == list(zip(ids, ["3", "7", "11"], strict=True))


async def test_a_failover_to_anthropic_sends_the_calls_an_openai_compatible_server_named(
    server: FakeLLMServer, http: httpx.AsyncClient
) -> None:
    """Kimi K2 on vLLM names its calls ``functions.add:0``. When the next call of the turn failed over
    to Claude (``llm.fallback_models``), Anthropic refused the history (``tool_use.id: String should
    match pattern``), and so every later request of the chat, after a switch to Claude too."""
    llm = llm_client(server, http, "openai", fallback_models=["claude-haiku-4-5"])
    server.script(
        FakeReply(
            tool_calls=[("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})],
            call_ids=["functions.add:0", "functions.add:1"],
        ),
        FakeReply(status=503),
        FakeReply(text="3 and 7."),
    )
    tools = tool_settings()
    loop = ToolLoopSystem(llm, ToolRegistry([AddTool()], tools), tools)
    turn = new_turn()
    await loop.process(turn)

    assert turn.reply == "3 and 7." and turn.failures == []
    assert [r.api for r in server.requests] == ["openai", "openai", "anthropic"]
    assert call_ids(turn.session) == ["functions.add:0", "functions.add:1"]  # as the model wrote them
    calls, results = sent_calls("anthropic", server.requests[-1].body)
    assert len(set(calls)) == 2 and results == list(zip(calls, ["3", "7"], strict=True))

    server.script(FakeReply(text="10."))  # the operator switches the chat to Claude
    later = new_turn("and 3 + 7?", session=turn.session)
    await loop_for(server, http, "anthropic", [AddTool()]).process(later)
    assert later.reply == "10." and later.failures == []


# ---- limits -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
async def test_model_call_limit_gives_best_answer_and_a_note(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    counter = iter(range(100))
    server.responder = lambda _api, _body: FakeReply(
        text="partial answer", tool_calls=[("add", {"a": next(counter), "b": 0})]
    )
    turn = new_turn()
    await loop_for(server, http, api, [AddTool()], tool_settings(max_llm_calls=3)).process(turn)

    assert len(server.requests) == 3
    assert turn.reply == "partial answer"
    assert turn.notes == ["Stopped early: it reached the limit of 3 model calls."]
    # The last call is told so: a model that keeps calling tools is asked to answer from what it has.
    assert [LAST_CALL in json.dumps(r.body) for r in server.requests] == [False, False, True]
    assert_paired(turn.session)


@pytest.mark.parametrize("api", APIS)
async def test_a_model_stuck_on_one_call_answers_on_its_last_call(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    """The same call again and again, with no text: the user got "I couldn't finish this one." after
    the limit, though the results were there to answer from."""
    server.responder = lambda _api, body: (
        FakeReply(text="1 + 2 is 3.")
        if LAST_CALL in json.dumps(body)
        else FakeReply(tool_calls=[("add", {"a": 1, "b": 2})])
    )
    turn = new_turn()
    await loop_for(server, http, api, [AddTool()], tool_settings(max_llm_calls=5)).process(turn)

    assert len(server.requests) == 5
    assert turn.reply == "1 + 2 is 3." and turn.notes == []
    assert_paired(turn.session)


@pytest.mark.parametrize("api", APIS)
async def test_tool_call_limit_stops_after_recording_every_result(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    add = AddTool()
    server.script(
        FakeReply(text="step", tool_calls=[("add", {"a": i, "b": 0}) for i in range(3)]),
        FakeReply(text="0 and 1; I could not add 2."),
    )
    turn = new_turn()
    await loop_for(server, http, api, [add], tool_settings(max_tool_calls=2)).process(turn)

    assert len(add.calls) == 2
    assert tool_results(turn.session) == ["0", "1", NOT_RUN]
    # The model reads what did run and answers from it, told that nothing more will run.
    assert turn.reply == "0 and 1; I could not add 2."
    assert turn.notes == ["Some tool calls were not run: it reached the limit of 2 tool calls."]
    assert [LAST_CALL in json.dumps(r.body) for r in server.requests] == [False, True]
    assert_paired(turn.session)


@pytest.mark.parametrize("api", APIS)
async def test_tool_calls_past_the_tool_call_limit_are_not_run_and_the_turn_stops(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    add = AddTool()
    server.responder = lambda _api, _body: FakeReply(text="more", tool_calls=[("add", {"a": 1, "b": 1})])
    turn = new_turn()
    await loop_for(server, http, api, [add], tool_settings(max_tool_calls=1)).process(turn)

    assert len(server.requests) == 2 and len(add.calls) == 1
    assert tool_results(turn.session) == ["2", NOT_RUN]
    assert turn.reply == "more"
    assert turn.notes == ["Stopped early: it reached the limit of 1 tool calls."]
    assert_paired(turn.session)


@pytest.mark.parametrize("api", APIS)
async def test_an_answer_with_thousands_of_calls_keeps_and_runs_only_the_first(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    """Stored with one "Not run" result each, they made every later request of the chat too long."""
    add, held, limit = AddTool(), 2000, MAX_CALLS_PER_ANSWER
    server.script(
        FakeReply(tool_calls=[("add", {"a": i, "b": 0}) for i in range(held)]),
        FakeReply(text="I added the first ones."),
    )
    turn = new_turn()
    await loop_for(server, http, api, [add]).process(turn)

    assert len(add.calls) == limit
    [answer] = [m for m in turn.session.messages if m.tool_calls]
    assert len(answer.tool_calls) == limit
    assert tool_results(turn.session) == [str(i) for i in range(limit)]
    assert_paired(turn.session)
    # The next request (which the fake checks as the API would) holds the kept calls and their results
    # only, and tells the model what became of the others.
    sent = json.dumps(server.requests[1].body)
    assert sent.count('"role": "tool"' if api == "openai" else '"type": "tool_result"') == limit
    assert TOO_MANY_CALLS.format(held=held, limit=limit, dropped=held - limit) in sent
    assert turn.reply == "I added the first ones."
    assert turn.notes == [f"Some tool calls were not run: the model asked for more than {limit} at once."]


@pytest.mark.parametrize("api", APIS)
async def test_deadline_stops_the_loop(server: FakeLLMServer, http: httpx.AsyncClient, api: str) -> None:
    clock = FakeClock()
    server.responder = lambda _api, _body: FakeReply(tool_calls=[("tick", {})])
    turn = new_turn()
    system = loop_for(server, http, api, [TickTool(clock)], tool_settings(turn_deadline=600), clock=clock)
    await system.process(turn)

    assert len(server.requests) == 1
    assert turn.reply == "I couldn't finish this one."
    assert turn.notes == ["Stopped early: it ran past the 600 s deadline."]
    assert_paired(turn.session)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_deadline_ends_a_model_call_that_keeps_coming_but_never_ends(
    server: FakeLLMServer, http: httpx.AsyncClient, stream: bool
) -> None:
    """A server that keeps sending yet never finishes stays within the client's idle limit: streamed,
    events that carry nothing (``choices: []``) every 0.05 s; not streamed, a body dripping a byte at
    a time, inside a generous ``llm.timeout``. The turn deadline is what ends it, in both ways."""
    reply = (
        FakeReply(
            text="never done", stall_after=2, stall=60, keepalive=0.05, keepalive_data='{"choices": []}'
        )
        if stream
        else FakeReply(text="never done", drip=0.05, stall=60)
    )
    server.script(reply)
    settings = tool_settings(turn_deadline=1)
    llm = llm_client(server, http, "openai", timeout=60, idle_timeout=0.5)
    system = ToolLoopSystem(llm, ToolRegistry([], settings), settings)
    turn = new_turn()
    if stream:
        turn.on_partial = Sink()
    async with asyncio.timeout(20):
        await system.process(turn)

    assert turn.reply == "I couldn't finish this one."
    assert turn.notes == ["Stopped early: it ran past the 1 s deadline."]
    assert len(server.requests) == 1


@pytest.mark.parametrize("api", APIS)
async def test_repeat_guard_refuses_the_third_identical_call(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    add = AddTool()
    same = FakeReply(tool_calls=[("add", {"b": 2, "a": 1})])
    reordered = FakeReply(tool_calls=[("add", {"a": 1, "b": 2})])  # same arguments, other key order
    server.script(same, same, reordered, FakeReply(text="ok"))
    turn = new_turn()
    await loop_for(server, http, api, [add]).process(turn)

    assert len(add.calls) == 2
    results = tool_results(turn.session)
    assert results[:2] == ["3", "3"]
    assert results[2].startswith("Error: add was already called 2 times with exactly these arguments")
    assert turn.reply == "ok"


async def test_results_are_capped_head_and_tail(server: FakeLLMServer, http: httpx.AsyncClient) -> None:
    server.script(FakeReply(tool_calls=[("big", {})]), FakeReply(text="ok"))
    turn = new_turn()
    await loop_for(server, http, "openai", [BigTool()], tool_settings(result_max_chars=1000)).process(turn)

    [result] = tool_results(turn.session)
    assert len(result) <= 1000
    assert result.startswith("HHH") and result.endswith("TTT")
    assert "characters cut ...]" in result


def test_cap_leaves_short_text_alone() -> None:
    assert cap("short", 100) == "short"
    capped = cap("x" * 500, 200)
    assert len(capped) <= 200 and "cut" in capped


# ---- cancellation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
async def test_stop_mid_tool_cancels_the_tool_and_keeps_the_session_valid(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    slow, add = SlowTool(), AddTool()
    server.script(FakeReply(tool_calls=[("slow", {}), ("add", {"a": 2, "b": 2})]))
    turn = new_turn()
    system = loop_for(server, http, api, [slow, add])
    task = asyncio.create_task(system.process(turn))
    async with asyncio.timeout(5):
        await slow.started.wait()
        while not add.calls or add.active:  # the quick call is done before the stop
            await asyncio.sleep(0)
    for _ in range(3):  # (and its result handed back)
        await asyncio.sleep(0)

    task.cancel()  # what /stop does to the turn's task
    done, _ = await asyncio.wait([task], timeout=1.0)
    assert done, "the turn did not stop within 1 s"
    assert task.cancelled()
    assert slow.cancelled
    assert tool_results(turn.session) == [CANCELLED, "4"]
    assert_paired(turn.session)

    # The next turn continues on that history and the provider accepts it (the fake validates pairing).
    follow_up = new_turn("and now?", session=turn.session)
    await system.process(follow_up)
    assert follow_up.reply == "echo: and now?"


# ---- context overflow hook --------------------------------------------------------------------------


def overflow_reply(api: str) -> FakeReply:
    message = "This model's maximum context length is 1000 tokens"
    if api == "anthropic":
        message = "prompt is too long: 2000 tokens > 1000 maximum"
        return FakeReply(
            status=400,
            error={"type": "error", "error": {"type": "invalid_request_error", "message": message}},
        )
    return FakeReply(
        status=400,
        error={
            "error": {"message": message, "type": "invalid_request_error", "code": "context_length_exceeded"}
        },
    )


def budget_for(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str, *, window: int = 100_000, **compaction: Any
) -> ContextBudget:
    """A real context budget over a compaction service that summarizes through the same fake model."""
    settings = CompactionSettings(**compaction)
    counter = TokenCounter.approximate()
    retirer = RecordingRetirer()
    service = CompactionService(llm_client(server, http, api), counter, retirer, settings, summary_model=None)
    return ContextBudget(counter, service, retirer, settings, window=window, max_output_tokens=1024)


def earlier(n: int) -> Session:
    session = Session.new("test", "chat")
    for m in conversation(n):
        session.append(m)
    return session


@pytest.mark.parametrize("api", APIS)
async def test_an_overflow_compacts_through_the_budget_then_retries(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    server.script(
        overflow_reply(api), FakeReply(text="- the earlier chat, summarized"), FakeReply(text="fits now")
    )
    turn = new_turn(session=earlier(30))
    budget = budget_for(server, http, api, keep_last=4)
    await loop_for(server, http, api, [AddTool()], budget=budget).process(turn)
    assert turn.reply == "fits now"
    first, retry = server.requests[0].body["messages"], server.requests[2].body["messages"]
    assert len(retry) < len(first) and turn.session.compactions == 1


async def test_overflow_retries_are_bounded(server: FakeLLMServer, http: httpx.AsyncClient) -> None:
    server.responder = lambda api, body: (
        FakeReply(text="- a summary of it all")
        if "compress the older part" in json.dumps(body)
        else overflow_reply(api)
    )
    turn = new_turn(session=earlier(40))
    budget = budget_for(server, http, "openai", keep_last=16)
    system = loop_for(server, http, "openai", [AddTool()], budget=budget, max_overflow_retries=2)
    with pytest.raises(LLMContextOverflow):
        await system.process(turn)
    chats = [r for r in server.requests if "compress the older part" not in json.dumps(r.body)]
    assert len(chats) == 3  # the first try and two retries
    assert turn.session.compactions == 2


PAGE_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}}


class PageTool:
    """Returns one long page, marked at both ends so what survives a cut can be told."""

    name = "page"
    description = "Fetch a long page."
    parameters = PAGE_SCHEMA

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return f"START{args['n']} " + "lorem ipsum " * 1300 + f" END{args['n']}"


@pytest.mark.parametrize("api", APIS)
async def test_results_that_overflow_the_window_are_cut_not_the_question(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str
) -> None:
    """Six results of ~4,000 tokens each after one call, in a 16k window: the next request used to keep
    only the last result (as orphaned text), without the question or the calls that asked for it."""
    server.script(FakeReply(tool_calls=[("page", {"n": n}) for n in range(6)]), FakeReply(text="ok"))
    turn = new_turn("Which pages mention QUESTION-MARKER?")
    budget = budget_for(server, http, api, window=16_000)
    settings = tool_settings(enabled=["page"])
    await loop_for(server, http, api, [PageTool()], settings, budget=budget).process(turn)

    assert turn.reply == "ok"
    sent = json.dumps(server.requests[1].body)
    assert "QUESTION-MARKER" in sent
    assert "earlier result of" not in sent  # every result still follows its call
    assert all(f"START{n}" in sent and f"END{n}" in sent for n in range(6))  # each cut, none left out
    assert sent.count("characters left out here") == 6
    assert len(sent) // 4 + 1024 <= 16_000 * 1.1  # and it fits the window (as the fake counts, roughly)
    assert_paired(turn.session)
    assert len(tool_results(turn.session)[0]) > 15_000  # the session keeps them whole


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    ("window", "mark"), [(2_600, " characters left out \\u2026]"), (2_400, '"[\\u2026]"')]
)
async def test_results_too_many_to_keep_any_of_their_text_say_so_rather_than_arrive_empty(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str, window: int, mark: str
) -> None:
    """Sixty long results in a small window leave each less room than the cut note: each was sent as
    an empty result, which the model took for an empty page. Now each says it was cut (in as few
    tokens as "[…]" when the room is smaller still)."""
    server.script(FakeReply(tool_calls=[("page", {"n": n}) for n in range(60)]), FakeReply(text="ok"))
    turn = new_turn("Which pages mention QUESTION-MARKER?")
    budget = budget_for(server, http, api, window=window)
    settings = tool_settings(enabled=["page"])
    await loop_for(server, http, api, [PageTool()], settings, budget=budget).process(turn)

    assert turn.reply == "ok"
    sent = json.dumps(server.requests[1].body)
    assert "QUESTION-MARKER" in sent
    assert sent.count(mark) == 60  # each result says what became of it
    assert_paired(turn.session)


# ---- per-channel tools ------------------------------------------------------------------------------


async def test_denied_tool_is_neither_offered_nor_run(server: FakeLLMServer, http: httpx.AsyncClient) -> None:
    add = AddTool()
    settings = tool_settings(channel_deny={"test": ["add"]})
    server.script(FakeReply(tool_calls=[("add", {"a": 1, "b": 1})]), FakeReply(text="ok"))
    turn = new_turn()
    await loop_for(server, http, "openai", [add, BigTool()], settings).process(turn)

    assert [t["function"]["name"] for t in server.requests[0].body["tools"]] == ["big"]
    assert add.calls == []
    assert tool_results(turn.session)[0].startswith("Error: there is no tool named 'add'")


# ---- with the built-in tools ------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
async def test_builtin_tools_through_the_loop(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str, tmp_path: Path
) -> None:
    settings = ToolSettings()
    tools = builtin_tools(settings, workspace=tmp_path, timezone="Europe/Berlin", http=http)
    server.script(
        FakeReply(
            tool_calls=[
                ("files", {"action": "write", "path": "todo.md", "content": "- water plants\n"}),
                ("time", {}),
                ("web_fetch", {"url": "http://169.254.169.254/latest/meta-data/"}),
            ]
        ),
        FakeReply(tool_calls=[("files", {"action": "read", "path": "../../etc/passwd"})]),
        FakeReply(tool_calls=[("files", {"action": "read", "path": "todo.md"})]),
        FakeReply(text="Your list says: water plants."),
    )
    turn = new_turn("what is on my list?")
    system = ToolLoopSystem(llm_client(server, http, api), ToolRegistry(tools, settings), settings)
    await system.process(turn)

    assert turn.reply == "Your list says: water plants."
    wrote, now, fetched, escaped, read = tool_results(turn.session)
    assert wrote == "Wrote 15 characters to todo.md."
    assert "Europe/Berlin" in now
    assert fetched.startswith("Error: refused: 169.254.169.254 is a cloud metadata address")
    assert escaped.startswith("Error: '..' is not allowed")
    assert "<untrusted source='file todo.md'>" in read and "- water plants" in read
    assert (tmp_path / "todo.md").read_text() == "- water plants\n"
    assert_paired(turn.session)


@pytest.mark.parametrize("api", APIS)
async def test_a_file_write_never_replaces_text_the_model_has_not_seen(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str, tmp_path: Path
) -> None:
    """A whole-file write over the operator's notes the model never read, or over an edit the operator
    saved after the model's read, replaced that text without a word; it is refused until the model has
    read the file as it is now, and the model may then replace it, and its own text, again."""
    todo = tmp_path / "notes" / "todo.md"
    todo.parent.mkdir()
    todo.write_text("- operator: pay rent\n")
    settings = ToolSettings()
    tools = builtin_tools(settings, workspace=tmp_path, timezone="UTC", http=http)
    mine = "- operator: pay rent\n- operator: call mom\n- water plants\n"
    calls: list[dict[str, Any]] = [
        {"action": "write", "path": "notes/todo.md", "content": "- water plants\n"},
        {"action": "read", "path": "notes/todo.md"},
        {"action": "write", "path": "notes/todo.md", "content": "- operator: pay rent\n- water plants\n"},
        {"action": "read", "path": "notes/todo.md"},
        {"action": "write", "path": "notes/todo.md", "content": mine},
        {"action": "write", "path": "notes/todo.md", "content": mine + "- buy milk\n"},
    ]

    def respond(_api: str, _body: dict[str, Any]) -> FakeReply:
        if len(calls) == 4:  # the operator saves an edit between the model's read and its write
            todo.write_text("- operator: pay rent\n- operator: call mom\n")
        return FakeReply(tool_calls=[("files", calls.pop(0))]) if calls else FakeReply(text="Done.")

    server.responder = respond
    turn = new_turn("add watering to my list")
    await ToolLoopSystem(llm_client(server, http, api), ToolRegistry(tools, settings), settings).process(turn)

    unread, _, changed, _, wrote, again = tool_results(turn.session)
    assert unread.startswith("Error: notes/todo.md already exists and you have not read it")
    assert "Read it first (action 'read')" in unread and "'append'" in unread
    assert changed.startswith("Error: notes/todo.md already exists and it has changed since you read it")
    assert wrote == f"Wrote {len(mine)} characters to notes/todo.md."
    assert again.startswith("Wrote ")
    assert todo.read_text() == mine + "- buy milk\n"
    assert turn.reply == "Done."


@pytest.mark.parametrize("api", APIS)
async def test_a_file_not_in_utf8_is_never_written_back_with_its_letters_lost(
    server: FakeLLMServer, http: httpx.AsyncClient, api: str, tmp_path: Path
) -> None:
    """The operator's Latin-1 file read whole showed each accented letter as "\ufffd", and the model's
    write of what it read (plus its line) turned them into that for good; the read now says so, and
    the write is refused, the file as it was."""
    recipes = tmp_path / "recettes.txt"
    latin = "crème brûlée\ncafé au lait\n".encode("latin-1")
    recipes.write_bytes(latin)
    settings = ToolSettings()
    tools = builtin_tools(settings, workspace=tmp_path, timezone="UTC", http=http)
    seen = latin.decode("utf-8", errors="replace")
    server.script(
        FakeReply(tool_calls=[("files", {"action": "read", "path": "recettes.txt"})]),
        FakeReply(
            tool_calls=[("files", {"action": "write", "path": "recettes.txt", "content": seen + "tarte\n"})]
        ),
        FakeReply(text="Done."),
    )
    turn = new_turn("add tarte to my recipes")
    await ToolLoopSystem(llm_client(server, http, api), ToolRegistry(tools, settings), settings).process(turn)

    read, wrote = tool_results(turn.session)
    assert "[note: recettes.txt is not UTF-8 text" in read
    assert wrote.startswith("Error: recettes.txt is not UTF-8 text") and "use action 'append'" in wrote
    assert recipes.read_bytes() == latin
