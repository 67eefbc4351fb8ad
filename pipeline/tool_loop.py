"""ToolLoopSystem (order 30): ask the model, run the tools it calls, feed results back, until it answers.

Invariant kept here: every assistant message with tool calls is followed by exactly one tool result per
call id, whatever happens (limits, bad arguments, unknown tools, timeouts, cancellation), so the history
is always valid for both providers and compaction can never split a pair it did not see.

With a ``journal`` (bot/tools/journal.py) every result is on disk before the model reads it, and a turn
run again (after a kill, or a model outage) gets the results of the calls it had made instead of making
them twice: a second ``append`` or shell command would repeat what the first already did.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from bot.config import ToolSettings
from bot.context_budget import ContextBudget
from bot.domain import Message, Role, ToolCall
from bot.errors import LLMContextOverflow, StorageError
from bot.llm import ChatRequest, ChatResponse
from bot.surrogates import scrub
from bot.tools import CallKey, Tool, ToolContext, ToolError, ToolJournal, ToolRegistry
from pipeline.base import Turn

if TYPE_CHECKING:  # bot.llm's client loads httpx; only the type is needed here
    from bot.llm import ChatModel

log = structlog.get_logger(__name__)

REPEAT_LIMIT = 2  # identical (tool, arguments) pairs allowed per turn
# Tool calls of one answer that are stored and run; the rest are dropped. Models send a handful at a
# time (a few dozen when fanning out over a list); an answer with thousands, stored with one result
# each, made every later request of the chat too long for the model's window.
MAX_CALLS_PER_ANSWER = 64
CANCELLED = "Cancelled: the turn was stopped before this tool call finished."
DEADLINE = "Not finished: the turn deadline passed."
NOT_RUN = "Not run: the tool call limit for this turn was reached."
CUT_SHORT = (
    "Not run: your answer hit the output limit before this call was complete, so its arguments may be "
    "cut short. Make it smaller (write a long text in parts, with action 'append') and call it again."
)
# Said to the model (after the system prompt) on the turn's last model call, or once no tool may run.
LAST_CALL = (
    "This is your last step in this turn: no tool you call now will run. Answer the user now from what "
    "you have found so far, and say what is still missing."
)
# Said the same way on the call after an answer with more than MAX_CALLS_PER_ANSWER tool calls.
TOO_MANY_CALLS = (
    "Your last answer held {held} tool calls; at most {limit} calls of one answer are run, so the first "
    "{limit} were kept and the other {dropped} were dropped without running. If you still need them, "
    "call them again in later steps, at most {limit} at a time."
)
# Said the same way on the one extra call after the model answered tool results with no text at all.
ANSWER_NOW = (
    "Your last reply to the user had no text. Answer the user now, in plain text, from the tool results "
    "you have."
)


class ToolObserver(Protocol):
    """Receives one outcome per tool call (ok, error, timeout, unknown, bad_arguments, ...) for metrics."""

    def tool_call(self, name: str, outcome: str) -> None: ...


class _Stop(Exception):
    """A per-turn limit was reached; the message says which, for the user's note."""


class ToolLoopSystem:
    """The system that talks to the model in a turn.

    One turn:

    1. Send the session history, ``turn.system_prompt`` and the tools this channel may use.
    2. Store the answer as an assistant message. No tool calls: that text is ``turn.reply``; done.
    3. Run the tool calls of that answer concurrently (at most ``max_parallel``, each under
       ``tool_timeout``), store one tool result per call id, and go back to 1.

    Limits per turn (``max_llm_calls``, ``max_tool_calls``, ``turn_deadline``) end the loop with the best
    text so far and a note in ``turn.notes``. The model call that is the last one (the next would pass
    ``max_llm_calls``, or no tool call is left) tells the model so, and it answers from the results it
    has rather than leaving the user with none. An answer's calls past :data:`MAX_CALLS_PER_ANSWER` are
    dropped before it is stored, and the next model call is told so (:data:`TOO_MANY_CALLS`). An answer
    with no text after tool calls gets one more call a turn, told to answer in plain text
    (:data:`ANSWER_NOW`); if that is blank too, ``turn.reply`` is ``""`` and the dispatcher sends its
    failed-turn text. Every request goes through the context ``budget`` first (it and the answer must
    fit the window: bot/context_budget.py); a request that would not fit, or that the provider refused
    as too long, makes the budget compact the session and the call is retried, at most
    ``max_overflow_retries`` times. When ``turn.on_partial`` is set the answer is streamed and the sink
    receives the text of the current model call so far, after every delta.
    """

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
        budget: ContextBudget | None = None,
        max_overflow_retries: int = 3,
        observer: ToolObserver | None = None,
        journal: ToolJournal | None = None,
    ) -> None:
        self._llm = llm
        self._journal = journal
        self._registry = registry
        self._settings = settings
        self._clock = clock
        self._budget = budget
        self._max_overflow_retries = max_overflow_retries
        self._observer = observer

    def should_process(self, turn: Turn) -> bool:
        return turn.reply is None

    async def process(self, turn: Turn) -> None:
        run = _TurnRun(self, turn)
        try:
            await run.loop()
        except _Stop as stop:
            turn.reply = run.best or "I couldn't finish this one."
            turn.notes.append(f"Stopped early: {stop}.")
            log.warning(
                "tool_loop_limit", reason=str(stop), llm_calls=run.llm_calls, tool_calls=run.tool_runs
            )


class _TurnRun:
    """The mutable state of one turn's loop (counters, repeat guard, best text so far)."""

    def __init__(self, system: ToolLoopSystem, turn: Turn) -> None:
        self.system = system
        self.settings = system._settings
        self.turn = turn
        self.deadline = system._clock() + self.settings.turn_deadline
        self.ctx = ToolContext(turn.session.id, turn.channel, turn.id)
        self.specs = system._registry.specs(turn.channel)
        self.seen: Counter[tuple[str, str]] = Counter()
        self.llm_calls = self.tool_runs = self.overflows = 0
        self.not_run = 0  # calls refused for the tool-call limit
        self.cut_short = 0  # calls of answers cut off at the output limit: never run
        self.dropped = 0  # calls past MAX_CALLS_PER_ANSWER: neither stored nor run
        self.asked_again = False  # after an empty answer (once a turn)
        self.best = ""
        self.partial_ok = turn.on_partial is not None
        # What an earlier run of this turn recorded (see ToolJournal): read at its first tool call.
        self.replays: dict[CallKey, str] | None = None
        first_id = turn.inbound[0].message_id if turn.inbound else None
        self.journal = system._journal if first_id else None  # a turn without an id has nothing to match
        self.turn_key = first_id or ""

    def remaining(self) -> float:
        return self.deadline - self.system._clock()

    def deadline_stop(self) -> _Stop:
        return _Stop(f"it ran past the {self.settings.turn_deadline:g} s deadline")

    async def loop(self) -> None:
        s, turn = self.settings, self.turn
        note = ""  # what the next model call is told after the system prompt
        too_many = ""  # said before it when the last answer held too many calls (TOO_MANY_CALLS)
        while True:
            if self.llm_calls >= s.max_llm_calls:
                raise _Stop(f"it reached the limit of {s.max_llm_calls} model calls")
            out_of_tools = self.llm_calls > 0 and self.tool_runs >= s.max_tool_calls
            last = out_of_tools or (self.llm_calls > 0 and self.llm_calls == s.max_llm_calls - 1)
            response = await self.ask(note=_joined(too_many, LAST_CALL if last else note))
            note = ""
            self.llm_calls += 1
            turn.usage.add(response.usage)
            said = bool(response.content.strip())
            calls, too_many = self.kept(response.tool_calls)
            if said or calls:  # a blank answer is not kept: the next call reads the results
                turn.add_message(Message(Role.ASSISTANT, response.content, tool_calls=calls))
            if said:
                self.best = response.content
            if calls and response.cut_off:
                # Cut at the output limit, a call may lack the end of its arguments and still parse
                # ("write" with half a report): none of it runs; the model reads why, and tries again.
                self.cut_short += len(calls)
                for call in calls:
                    turn.add_message(Message(Role.TOOL, CUT_SHORT, tool_call_id=call.id, name=call.name))
                continue
            if not calls:
                if not said and self.empty_answer():
                    note = ANSWER_NOW
                    continue
                turn.reply = response.content if said else ""  # "": the dispatcher's failed-turn reply
                if response.cut_off and said:  # the user should know it is not all
                    turn.notes.append("The answer was cut off at the model's output limit: ask me to go on.")
                if self.not_run:
                    limit = s.max_tool_calls
                    turn.notes.append(
                        f"Some tool calls were not run: it reached the limit of {limit} tool calls."
                    )
                if self.cut_short:
                    turn.notes.append(
                        "Some tool calls were not run: the model's answer was cut off at its output limit."
                    )
                if self.dropped:
                    turn.notes.append(
                        f"Some tool calls were not run: the model asked for more than {MAX_CALLS_PER_ANSWER} "
                        "at once."
                    )
                return
            await self.run_calls(calls)
            if out_of_tools:  # told that nothing would run, it called tools again
                raise _Stop(f"it reached the limit of {s.max_tool_calls} tool calls")

    def kept(self, calls: tuple[ToolCall, ...]) -> tuple[tuple[ToolCall, ...], str]:
        """The calls of one answer that are stored and run, and what the next model call is told
        when there were too many (``""`` otherwise).

        The rest are dropped before the answer is stored: each stored call needs its result in the
        history (OpenAI refuses a call without one), so thousands of calls, each answered "Not run",
        would fill the model's window on every later request of the chat."""
        if len(calls) <= MAX_CALLS_PER_ANSWER:
            return calls, ""
        held, limit = len(calls), MAX_CALLS_PER_ANSWER
        self.dropped += held - limit
        log.warning("tool_calls_dropped", held=held, kept=limit, llm_calls=self.llm_calls)
        return calls[:limit], TOO_MANY_CALLS.format(held=held, limit=limit, dropped=held - limit)

    def empty_answer(self) -> bool:
        """The model answered with no text and no call; True if it is asked once more.

        After tool results, local models often stop there, as if the results were the answer. The
        user expects one, so the model is asked once a turn (:data:`ANSWER_NOW`), within the model-call
        limit; otherwise the turn ends with no reply and the dispatcher sends its failed-turn text, so a
        blank message never goes out (Discord dropped it unseen, Telegram showed "(empty reply)")."""
        called_tools = self.tool_runs + self.not_run + self.cut_short > 0
        again = called_tools and not self.asked_again and self.llm_calls < self.settings.max_llm_calls
        self.asked_again = self.asked_again or again
        log.warning(
            "empty_answer",
            action="asked again" if again else "fallback",
            after_tools=called_tools,
            llm_calls=self.llm_calls,
            tool_calls=self.tool_runs,
        )
        return again

    async def ask(self, *, note: str = "") -> ChatResponse:
        """One model call within the deadline; a request too long for the window compacts, then retries.
        ``note`` is said to the model after the system prompt (:data:`LAST_CALL`, :data:`ANSWER_NOW`).
        The tools are still offered: Anthropic refuses a history with tool calls in a request that
        defines none."""
        budget = self.system._budget
        system = self.turn.system_prompt
        if note:
            system = f"{system}\n\n{note}" if system.strip() else note
        while True:
            remaining = self.remaining()
            if remaining <= 0:
                raise self.deadline_stop()
            session = self.turn.session
            request = ChatRequest(messages=tuple(session.messages), system=system, tools=self.specs)
            if budget is not None:
                if (
                    budget.request_tokens(request, session) + budget.output > budget.window
                    and await self.compact()
                ):
                    continue  # made room: build the request again from the compacted session
                request = budget.fit(request, session, keep=self.turn.own_count())
            try:
                async with asyncio.timeout(remaining) as window:
                    return await self._call(request)
            except TimeoutError:
                if window.expired():  # our deadline, not the client's own LLMTimeout
                    raise self.deadline_stop() from None
                raise
            except LLMContextOverflow:
                log.warning("context_overflow_retry", attempt=self.overflows + 1)
                if not await self.compact():
                    raise

    async def compact(self) -> bool:
        """Ask the budget to make room (at most ``max_overflow_retries`` times a turn); True if it did."""
        budget = self.system._budget
        if budget is None or self.overflows >= self.system._max_overflow_retries:
            return False
        self.overflows += 1
        return await budget.on_overflow(
            self.turn.session, self.turn.system_prompt, self.overflows, keep_at_least=self.turn.own_count()
        )

    async def _call(self, request: ChatRequest) -> ChatResponse:
        sink = self.turn.on_partial
        if sink is None:
            return await self.system._llm.chat(request)
        text = ""
        final: ChatResponse | None = None
        events = self.system._llm.stream(request)
        try:
            async for event in events:
                if event.kind == "text" and event.text:
                    text += event.text
                    if self.partial_ok:
                        try:
                            await sink(text)
                        except Exception:  # a display hiccup must not cost the answer
                            log.exception("partial_sink_failed")
                            self.partial_ok = False
                elif event.kind == "done":
                    final = event.response
        finally:  # on /stop too: close the HTTP stream now, not whenever the generator is collected
            close = getattr(events, "aclose", None)
            if close is not None:
                await close()
        return final if final is not None else ChatResponse(content=text)

    async def run_calls(self, calls: tuple[ToolCall, ...]) -> None:
        """Run one response's tool calls (concurrently, bounded) and record one result per call.

        Raises :class:`_Stop` after recording when the deadline cut the batch; calls past the tool-call
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
            if self.system._observer is not None:
                self.system._observer.tool_call(call.name, outcome)

    async def _execute(self, call: ToolCall) -> tuple[str, str]:
        """Run one call; every failure becomes ``(message for the model, outcome)``."""
        tool = self.system._registry.get(call.name, self.ctx.channel)
        if tool is None:
            names = ", ".join(t.name for t in self.system._registry.available(self.ctx.channel)) or "none"
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


def _joined(*notes: str) -> str:
    return "\n\n".join(note for note in notes if note)


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
