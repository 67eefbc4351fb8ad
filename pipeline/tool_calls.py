"""The tool side of a turn's loop: run one answer's tool calls and record exactly one result per call.

The calls run concurrently (at most ``max_parallel``, each under ``tool_timeout``) within the turn's
deadline. Every failure (an unknown tool, bad arguments, a repeat, a timeout, a crash) becomes text for
the model, and every call id gets its result, whatever happens: the invariant pipeline/tool_loop.py
states.

With a ``journal`` (bot/tools/journal.py) every result is on disk before the model reads it, and a turn
run again (after a kill, or a model outage) gets the results of the calls it had made instead of making
them twice: a second ``append`` or shell command would repeat what the first already did.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from bot.config import ToolSettings
from bot.domain import Message, Role, ToolCall
from bot.errors import StorageError
from bot.surrogates import scrub
from bot.tools import CallKey, Tool, ToolContext, ToolError, ToolJournal, ToolRegistry
from pipeline.base import Turn

log = structlog.get_logger(__name__)

REPEAT_LIMIT = 2  # identical (tool, arguments) pairs allowed per turn
CANCELLED = "Cancelled: the turn was stopped before this tool call finished."
DEADLINE = "Not finished: the turn deadline passed."
NOT_RUN = "Not run: the tool call limit for this turn was reached."
UNKNOWN_TOOL = "(unknown)"  # the name metrics give a call of a tool that does not exist


class ToolObserver(Protocol):
    """Receives one outcome per tool call (ok, error, timeout, unknown, bad_arguments, ...) for metrics.

    ``name`` is always a tool's own name, or :data:`UNKNOWN_TOOL` when the model called one that does
    not exist: the model writes those names (a page it read can choose them), and each would be a
    metrics series of its own, kept for the life of the process."""

    def tool_call(self, name: str, outcome: str) -> None: ...


class LimitReached(Exception):
    """A per-turn limit was reached; the message says which, for the user's note."""


@dataclass(frozen=True, slots=True)
class ToolKit:
    """What running tool calls needs, the same for every turn: the system that owns the loop
    (``ToolLoopSystem`` in tool_loop.py) builds it once and hands it to each turn's :class:`TurnTools`."""

    registry: ToolRegistry
    settings: ToolSettings
    clock: Callable[[], float]
    observer: ToolObserver | None = None
    journal: ToolJournal | None = None


class TurnTools:
    """What one turn's tool calls need across its loop (the deadline, the repeat guard, the results an
    earlier run recorded, the call counters) and the running of them; the loop (``_TurnRun`` in
    tool_loop.py) extends it."""

    def __init__(self, kit: ToolKit, turn: Turn) -> None:
        self.kit = kit
        self.settings = kit.settings
        self.turn = turn
        self.deadline = kit.clock() + self.settings.turn_deadline
        self.ctx = ToolContext(turn.session.id, turn.channel, turn.id)
        self.seen: Counter[tuple[str, str]] = Counter()
        self.tool_runs = 0
        self.not_run = 0  # calls refused for the tool-call limit
        # What an earlier run of this turn recorded (see ToolJournal): read at its first tool call.
        self.replays: dict[CallKey, str] | None = None
        first_id = turn.inbound[0].message_id if turn.inbound else None
        self.journal = kit.journal if first_id else None  # a turn without an id has nothing to match
        self.turn_key = first_id or ""

    def remaining(self) -> float:
        return self.deadline - self.kit.clock()

    def deadline_stop(self) -> LimitReached:
        return LimitReached(f"it ran past the {self.settings.turn_deadline:g} s deadline")

    async def run_calls(self, calls: tuple[ToolCall, ...]) -> None:
        """Run one response's tool calls (concurrently, bounded) and record one result per call.

        Raises :class:`LimitReached` after recording when the deadline cut the batch; calls past the tool-call
        limit are answered :data:`NOT_RUN` (the next model call is then the last).
        """
        budget = max(0, self.settings.max_tool_calls - self.tool_runs)
        if self.journal is not None and self.replays is None:
            try:
                self.replays = await self.journal.made(self.turn.session.id, self.turn_key)
            except OSError as exc:  # unreadable: every call runs, as without a record
                log.warning("tool_calls_not_read", error=str(exc))
                self.replays = {}
        results: dict[int, str] = {i: NOT_RUN for i in range(budget, len(calls))}
        self.not_run += len(results)
        gate = asyncio.Semaphore(max(1, self.settings.max_parallel))

        async def one(index: int, call: ToolCall) -> None:
            async with gate:
                results[index] = await self.run_one(call)

        tasks = [asyncio.create_task(one(i, c)) for i, c in enumerate(calls[:budget])]
        self.tool_runs += len(tasks)
        unfinished = DEADLINE
        timed_out = False
        try:
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=max(0.0, self.remaining()))
                if pending:
                    timed_out = True
                    await _cancel_all(pending)
        except asyncio.CancelledError:
            unfinished = CANCELLED
            await _cancel_all(tasks)
            raise
        finally:
            # A tool call and its result are never split: every call id gets exactly one result here.
            for index, call in enumerate(calls):
                text = results.get(index, unfinished)
                self.turn.add_message(Message(Role.TOOL, text, tool_call_id=call.id, name=call.name))
        if timed_out:
            raise self.deadline_stop()

    async def run_one(self, call: ToolCall) -> str:
        outcome = "ok"
        try:
            result, outcome = await self._execute(call)
            # A tool's text may hold lone surrogates (a file name that is not UTF-8, from os.scandir):
            # stored, it made every later request of the chat fail to encode.
            return cap(scrub(result), self.settings.result_max_chars)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            if self.kit.observer is not None:
                self.kit.observer.tool_call(call.name if outcome != "unknown" else UNKNOWN_TOOL, outcome)

    async def _execute(self, call: ToolCall) -> tuple[str, str]:
        """Run one call; every failure becomes ``(message for the model, outcome)``."""
        tool = self.kit.registry.get(call.name, self.ctx.channel)
        if tool is None:
            names = ", ".join(t.name for t in self.kit.registry.available(self.ctx.channel)) or "none"
            return f"Error: there is no tool named {call.name!r}. Available tools: {names}.", "unknown"
        try:
            args: Any = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as exc:
            where = f"{exc.msg} at position {exc.pos}"
            return (
                f"Error: the arguments are not valid JSON ({where}). Call {call.name} again with one JSON "
                "object that matches its schema.",
                "bad_arguments",
            )
        except RecursionError:  # "[[[[…" a thousand deep: a model repeating itself, not JSON to read
            return (
                f"Error: the arguments are nested too deeply to read. Call {call.name} again with one "
                "JSON object that matches its schema.",
                "bad_arguments",
            )
        if not isinstance(args, dict):
            return "Error: the arguments must be a JSON object.", "bad_arguments"
        key = (call.name, json.dumps(args, sort_keys=True))
        self.seen[key] += 1
        if self.seen[key] > REPEAT_LIMIT:
            return (
                f"Error: {call.name} was already called {REPEAT_LIMIT} times with exactly these arguments "
                "in this turn. Use the earlier results or change the arguments.",
                "repeated",
            )
        call_key = (call.name, key[1], self.seen[key])
        if self.replays and call_key in self.replays:  # run by an earlier run of this turn: not again
            log.info("tool_call_replayed", tool=call.name)
            return self.replays[call_key], "replayed"
        result, outcome = await self._run_tool(tool, call, args)
        if self.journal is not None:
            result = cap(scrub(result), self.settings.result_max_chars)  # as the model reads it
            try:
                await self.journal.keep(self.turn.session.id, self.turn_key, call_key, result)
            except (OSError, StorageError) as exc:  # the result stands; a rerun would run it again
                log.warning("tool_call_not_recorded", tool=call.name, error=str(exc))
        return result, outcome

    async def _run_tool(self, tool: Tool, call: ToolCall, args: dict[str, Any]) -> tuple[str, str]:
        limit = self.settings.tool_timeout
        try:
            async with asyncio.timeout(limit) as window:
                result: object = await tool.run(args, self.ctx)  # checked below, not trusted
        except TimeoutError:
            if window.expired():
                return f"Error: {call.name} did not finish within {limit:g} s.", "timeout"
            log.warning("tool_timeout_inside", tool=call.name)
            return f"Error: {call.name} timed out.", "error"
        except ToolError as exc:
            return f"Error: {exc}", "error"
        except Exception as exc:
            log.exception("tool_crashed", tool=call.name)
            return f"Error: {call.name} failed unexpectedly ({type(exc).__name__}).", "crashed"
        if not isinstance(result, str):  # a tool that broke its contract: its value is no result to store
            log.error("tool_result_not_text", tool=call.name, type=type(result).__name__)
            return f"Error: {call.name} failed unexpectedly (it returned no text).", "crashed"
        return result, "ok"


async def _cancel_all(tasks: Any) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def cap(text: str, limit: int) -> str:
    """Keep the head and the tail of an oversized result, with a marker saying what was cut."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - 60)
    head, tail = text[: keep * 2 // 3], text[len(text) - keep // 3 :]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters cut ...]\n{tail}"
