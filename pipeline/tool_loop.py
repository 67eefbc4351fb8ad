"""ToolLoopSystem (order 30): ask the model, run the tools it calls, feed results back, until it answers.

Invariant kept here: every assistant message with tool calls is followed by exactly one tool result per
call id, whatever happens (limits, bad arguments, unknown tools, timeouts, cancellation), so the history
is always valid for both providers and compaction can never split a pair it did not see.

Running an answer's tool calls (bounded, each under its timeout, with the ``journal`` that keeps a turn
run again from making a call twice) is pipeline/tool_calls.py; this module is the loop around it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from bot.config import ToolSettings
from bot.context_budget import ContextBudget
from bot.domain import Message, Role, ToolCall
from bot.errors import LLMContextOverflow
from bot.llm import ChatRequest, ChatResponse
from bot.long_answers import bounded
from bot.tools import ToolJournal, ToolRegistry
from bot.usage import META_ANSWERED_BY
from pipeline.base import Turn
from pipeline.tool_calls import LimitReached, ToolKit, ToolObserver, TurnTools

if TYPE_CHECKING:  # bot.llm's client loads httpx; only the type is needed here
    from bot.llm import ChatModel

log = structlog.get_logger(__name__)

# Tool calls of one answer that are stored and run; the rest are dropped. Models send a handful at a
# time (a few dozen when fanning out over a list); an answer with thousands, stored with one result
# each, made every later request of the chat too long for the model's window.
MAX_CALLS_PER_ANSWER = 64
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
# The turn's note when the model declined to answer (REFUSAL_REASONS): with no text (the chat is told
# this in place of an answer), or after some (the chat should know that it is not all).
DECLINED = "The AI model declined to answer this."
DECLINED_PART = "The AI model declined to go on, so this answer stops here."
# The turn's note when the model's output limit ran out before it wrote a word (a reasoning model that
# spent it all on thinking); the chat is told this in place of an answer, the log says what to raise.
NO_ROOM = "The AI model used up its output limit before it wrote any answer."
# Said the same way on the one extra call after the model answered tool results with no text at all.
ANSWER_NOW = (
    "Your last reply to the user had no text. Answer the user now, in plain text, from the tool results "
    "you have."
)


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
    failed-turn text. An answer the model declined to give (``stop_reason`` refusal or content_filter)
    is not asked for again: the turn's note says so (:data:`DECLINED`, or :data:`DECLINED_PART` after
    the text it gave before it stopped), and so does a blank answer cut off at the output limit
    (:data:`NO_ROOM`; the log names the setting to raise). Every request goes through the context
    ``budget`` first (it and the answer must fit the window: bot/context_budget.py); a request that
    would not fit, or that the provider refused as too long, makes the budget compact the session and
    the call is retried, at most ``max_overflow_retries`` times. When ``turn.on_partial`` is set the
    answer is streamed and the sink receives the text of the current model call so far, after every
    delta.
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
        self._kit = ToolKit(registry, settings, clock, observer=observer, journal=journal)
        self._budget = budget
        self._max_overflow_retries = max_overflow_retries

    def should_process(self, turn: Turn) -> bool:
        return turn.reply is None

    async def process(self, turn: Turn) -> None:
        run = _TurnRun(self, turn)
        try:
            await run.loop()
        except LimitReached as stop:
            turn.reply = run.best or "I couldn't finish this one."
            turn.notes.append(f"Stopped early: {stop}.")
            log.warning(
                "tool_loop_limit", reason=str(stop), llm_calls=run.llm_calls, tool_calls=run.tool_runs
            )


class _TurnRun(TurnTools):
    """The mutable state of one turn's loop (model calls, best text so far); what its tool calls need
    (the deadline, the repeat guard, the call counters) it has as a :class:`TurnTools`."""

    def __init__(self, system: ToolLoopSystem, turn: Turn) -> None:
        super().__init__(system._kit, turn)
        self.system = system
        self.specs = self.kit.registry.specs(turn.channel)
        self.llm_calls = self.overflows = 0
        self.cut_short = 0  # calls of answers cut off at the output limit: never run
        self.dropped = 0  # calls past MAX_CALLS_PER_ANSWER: neither stored nor run
        self.asked_again = False  # after an empty answer (once a turn)
        self.best = ""
        self.partial_ok = turn.on_partial is not None

    async def loop(self) -> None:
        s, turn = self.settings, self.turn
        note = ""  # what the next model call is told after the system prompt
        too_many = ""  # said before it when the last answer held too many calls (TOO_MANY_CALLS)
        while True:
            if self.llm_calls >= s.max_llm_calls:
                raise LimitReached(f"it reached the limit of {s.max_llm_calls} model calls")
            out_of_tools = self.llm_calls > 0 and self.tool_runs >= s.max_tool_calls
            last = out_of_tools or (self.llm_calls > 0 and self.llm_calls == s.max_llm_calls - 1)
            response = await self.ask(note=_joined(too_many, LAST_CALL if last else note))
            note = ""
            self.llm_calls += 1
            turn.usage.add(response.usage)
            if response.model_id:  # /status says which model answered: a fallback's, after a failover
                turn.session.metadata[META_ANSWERED_BY] = response.model_id
            said = bool(response.content.strip())
            content = bounded(response.content)  # kept as the chat gets it (bot/long_answers.py)
            if content != response.content:
                log.warning(
                    "answer_cut", model=response.model, chars=len(response.content), kept=len(content)
                )
            calls, too_many = self.kept(response.tool_calls)
            if said or calls:  # a blank answer is not kept: the next call reads the results
                turn.add_message(Message(Role.ASSISTANT, content, tool_calls=calls))
            if said:
                self.best = content
            if calls and response.cut_off:
                # Cut at the output limit, a call may lack the end of its arguments and still parse
                # ("write" with half a report): none of it runs; the model reads why, and tries again.
                self.cut_short += len(calls)
                for call in calls:
                    turn.add_message(Message(Role.TOOL, CUT_SHORT, tool_call_id=call.id, name=call.name))
                continue
            if not calls:
                if response.refused:  # asked again, it would decline again
                    log.warning("answer_refused", stop_reason=response.stop_reason, with_text=said)
                    if not response.refusal:  # (the model's own refusal says so itself)
                        turn.notes.append(DECLINED_PART if said else DECLINED)
                        turn.final_note = not said
                elif not said and response.cut_off:  # asked again, it would run out again
                    log.warning(
                        "empty_answer_cut_off",
                        stop_reason=response.stop_reason,
                        model=response.model,
                        fix="raise llm.max_output_tokens (MEMBOT_LLM__MAX_OUTPUT_TOKENS): a reasoning "
                        "model spends it on thinking before it writes the answer",
                    )
                    turn.notes.append(NO_ROOM)
                    turn.final_note = True
                elif not said and self.empty_answer():
                    note = ANSWER_NOW
                    continue
                turn.reply = content if said else ""  # "": the dispatcher's failed-turn reply
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
                raise LimitReached(f"it reached the limit of {s.max_tool_calls} tool calls")

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
                over = budget.request_tokens(request, session) + budget.output > budget.window
                if over and await self.compact(refused=False):  # our estimate, no refusal
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

    async def compact(self, *, refused: bool = True) -> bool:
        """Ask the budget to make room (at most ``max_overflow_retries`` times a turn); True if it did.
        ``refused``: the provider refused the request (else our own check found it too long)."""
        budget = self.system._budget
        if budget is None or self.overflows >= self.system._max_overflow_retries:
            return False
        self.overflows += 1
        return await budget.on_overflow(
            self.turn.session,
            self.turn.system_prompt,
            self.overflows,
            keep_at_least=self.turn.own_count(),
            refused=refused,
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


def _joined(*notes: str) -> str:
    return "\n\n".join(note for note in notes if note)
