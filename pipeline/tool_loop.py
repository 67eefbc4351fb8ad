"""ToolLoopSystem (order 30): ask the model, run the tools it calls, feed results back, until it answers.

Invariant kept here: every assistant message with tool calls is followed by exactly one tool result per
call id, whatever happens (limits, bad arguments, unknown tools, cancellation), so the history is always
valid for both providers and compaction can never split a pair it did not see.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

from bot.config import ToolSettings
from bot.domain import Message, Role, ToolCall
from bot.errors import LLMContextOverflow
from bot.llm.types import ChatRequest, ChatResponse, StreamEvent
from bot.tools.base import ToolContext, ToolError, ToolRegistry
from pipeline.base import Turn

log = structlog.get_logger(__name__)

OverflowHandler = Callable[[Turn], Awaitable[bool]]


class ChatModel(Protocol):
    async def chat(self, request: ChatRequest) -> ChatResponse: ...

    def stream(self, request: ChatRequest) -> Any: ...


class ToolObserver(Protocol):
    def tool_call(self, name: str, outcome: str) -> None: ...


class ToolLoopSystem:
    name = "tool_loop"
    order = 30
    enabled = True

    def __init__(
        self,
        llm: ChatModel,
        registry: ToolRegistry,
        settings: ToolSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_overflow: OverflowHandler | None = None,
        max_overflow_retries: int = 3,
        observer: ToolObserver | None = None,
    ) -> None:
        self._llm = llm
        self._registry = registry
        self._settings = settings
        self._clock = clock
        self._on_overflow = on_overflow
        self._max_overflow_retries = max_overflow_retries
        self._observer = observer

    def should_process(self, turn: Turn) -> bool:
        return turn.reply is None

    async def process(self, turn: Turn) -> None:
        s = self._settings
        deadline = self._clock() + s.turn_deadline
        specs = self._registry.specs(turn.channel)
        ctx = ToolContext(turn.session.id, turn.channel, turn.id)
        seen: Counter[tuple[str, str]] = Counter()
        llm_calls = tool_runs = overflows = 0
        best = ""
        stopped_by = ""
        while True:
            if llm_calls >= s.max_llm_calls:
                stopped_by = f"it reached the limit of {s.max_llm_calls} model calls"
                break
            remaining = deadline - self._clock()
            if remaining <= 0:
                stopped_by = f"it ran past the {s.turn_deadline:g} s deadline"
                break
            request = ChatRequest(
                messages=tuple(turn.session.messages), system=turn.system_prompt, tools=specs
            )
            try:
                async with asyncio.timeout(remaining):
                    response = await self._ask(request, turn)
            except TimeoutError:
                stopped_by = f"it ran past the {s.turn_deadline:g} s deadline"
                break
            except LLMContextOverflow:
                if self._on_overflow is None or overflows >= self._max_overflow_retries:
                    raise
                overflows += 1
                if not await self._on_overflow(turn):
                    raise
                continue
            llm_calls += 1
            turn.usage.add(response.usage)
            turn.add_message(Message(Role.ASSISTANT, response.content, tool_calls=response.tool_calls))
            if response.content.strip():
                best = response.content
            if not response.tool_calls:
                turn.reply = response.content
                return
            budget = s.max_tool_calls - tool_runs
            results = await self._run_calls(turn, response.tool_calls, ctx, seen, budget, deadline)
            tool_runs += min(budget, len(response.tool_calls))
            if budget < len(response.tool_calls):
                stopped_by = f"it reached the limit of {s.max_tool_calls} tool calls"
                break
            if results is None:
                stopped_by = f"it ran past the {s.turn_deadline:g} s deadline"
                break
        turn.reply = best or "I couldn't finish this one."
        turn.notes.append(f"(Stopped early: {stopped_by}.)")
        log.warning("tool_loop_limit", reason=stopped_by, llm_calls=llm_calls, tool_calls=tool_runs)

    async def _ask(self, request: ChatRequest, turn: Turn) -> ChatResponse:
        if turn.on_partial is None:
            return await self._llm.chat(request)
        text = ""
        final: ChatResponse | None = None
        event: StreamEvent
        async for event in self._llm.stream(request):
            if event.kind == "text":
                text += event.text
                await turn.on_partial(text)
            elif event.kind == "done":
                final = event.response
        if final is None:
            return ChatResponse(content=text)
        return final

    async def _run_calls(
        self,
        turn: Turn,
        calls: tuple[ToolCall, ...],
        ctx: ToolContext,
        seen: Counter[tuple[str, str]],
        budget: int,
        deadline: float,
    ) -> list[str] | None:
        """Run a response's tool calls (concurrently, bounded) and record one result per call id.

        Returns the results in call order, or ``None`` when the deadline cut the batch short.
        """
        results: dict[str, str] = {}
        gate = asyncio.Semaphore(max(1, self._settings.max_parallel))

        async def one(call: ToolCall) -> None:
            async with gate:
                results[call.id] = await self._run_one(call, ctx, seen)

        runnable = list(calls[: max(0, budget)])
        for call in calls[len(runnable) :]:
            results[call.id] = "Not run: the tool call limit for this turn was reached."
        tasks = [asyncio.create_task(one(call)) for call in runnable]
        timed_out = False
        outcome = "Not finished: the turn deadline passed."
        try:
            remaining = max(0.0, deadline - self._clock())
            _, pending = await asyncio.wait(tasks, timeout=remaining) if tasks else (set(), set())
            if pending:
                timed_out = True
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        except asyncio.CancelledError:
            outcome = "Cancelled: the user stopped this turn."
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            for call in calls:  # one result per call id, on every exit path
                result = results.get(call.id, outcome)
                turn.add_message(Message(Role.TOOL, result, tool_call_id=call.id, name=call.name))
        return None if timed_out else [results[c.id] for c in calls]

    async def _run_one(self, call: ToolCall, ctx: ToolContext, seen: Counter[tuple[str, str]]) -> str:
        outcome = "ok"
        try:
            tool = self._registry.get(call.name, ctx.channel)
            if tool is None:
                outcome = "unknown"
                names = ", ".join(t.name for t in self._registry.available(ctx.channel)) or "none"
                return f"Error: there is no tool named {call.name!r}. Available tools: {names}."
            try:
                args = json.loads(call.arguments or "{}")
            except json.JSONDecodeError as exc:
                outcome = "bad_arguments"
                where = f"{exc.msg} at position {exc.pos}"
                return f"Error: the arguments are not valid JSON ({where}). Send one JSON object."
            if not isinstance(args, dict):
                outcome = "bad_arguments"
                return "Error: the arguments must be a JSON object."
            key = (call.name, json.dumps(args, sort_keys=True))
            seen[key] += 1
            if seen[key] > 2:
                outcome = "repeated"
                return (
                    f"Error: {call.name} was already called twice with exactly these arguments in this turn. "
                    "Use the earlier results or change the arguments."
                )
            try:
                async with asyncio.timeout(self._settings.tool_timeout):
                    result = await tool.run(args, ctx)
            except TimeoutError:
                outcome = "timeout"
                return f"Error: {call.name} did not finish within {self._settings.tool_timeout:g} s."
            except ToolError as exc:
                outcome = "error"
                return f"Error: {exc}"
            except asyncio.CancelledError:
                outcome = "cancelled"
                raise
            except Exception as exc:
                outcome = "crashed"
                log.exception("tool_crashed", tool=call.name)
                return f"Error: {call.name} failed unexpectedly ({type(exc).__name__})."
            return cap(result, self._settings.result_max_chars)
        finally:
            if self._observer is not None:
                self._observer.tool_call(call.name, outcome)


def cap(text: str, limit: int) -> str:
    """Keep the head and the tail of an oversized result, with a marker saying what was cut."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - 80)
    head, tail = text[: keep * 2 // 3], text[len(text) - keep // 3 :]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters cut ...]\n{tail}"
