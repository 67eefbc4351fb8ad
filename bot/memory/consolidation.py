"""Consolidation: one LLM call turns retiring messages into a HISTORY entry and an updated MEMORY.md.

Consolidations run one at a time (an asyncio lock is the queue), so two sessions never race on
MEMORY.md; in chat scope each run names the chat's own MEMORY.md, and the queue stays shared. A
deadline covers waiting in the queue and the model call; when it passes, or the model fails, declines
(a refusal, a content filter) or answers garbage or nothing (no history entry and MEMORY.md as it was:
the facts such an answer lists are still stored), a ``[raw-fallback]`` entry keeps the last messages
verbatim instead.

An answer is used whole or not at all, and MEMORY.md is replaced only from an answer that can be
trusted to hold all of it (bot/memory/consolidation_reply.py reads it and says whether it can).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Protocol
from zoneinfo import ZoneInfo

import structlog

from bot.domain import Message, Role
from bot.errors import LLMError, plain_reason
from bot.llm import ChatRequest
from bot.memory.consolidation_reply import MAX_FACT_CHARS, memory_problem, parse_reply
from bot.memory.history import HistoryLog, raw_fallback_entry
from bot.memory.longterm import LongTermMemory
from bot.memory.longterm_errors import Conflict, MemoryFull, NotUtf8, ReadOnly, read_only_refused
from bot.memory.longterm_read import Snapshot, content_hash
from bot.memory.pending import DurableFact, Journal, Plan
from bot.memory.text_merge import in_style_of

if TYPE_CHECKING:  # bot.llm's client loads httpx; only the type is needed here
    from bot.llm import ChatModel

log = structlog.get_logger(__name__)

MESSAGE_CHARS = 1500

SYSTEM = (
    "You are the memory consolidation step of a chat assistant. You read an excerpt of a conversation "
    "and the assistant's long-term memory file, and answer with one JSON object only, no prose:\n"
    '{"history_entry": "2-5 sentences: what happened, decisions, open tasks, exact names/numbers",\n'
    ' "memory_update": "the complete new MEMORY.md (markdown); return it unchanged if nothing durable '
    'was learned",\n'
    ' "memory_pruned": "only if memory_update drops or rewrites more than half of the current lines: '
    'why",\n'
    ' "items": [{"type": "preference|fact|decision|constraint|fix|failure|task_state", "content": "...", '
    '"confidence": 0.0-1.0}]}\n'
    "Keep every fact the operator wrote in MEMORY.md unless the conversation shows it is wrong. "
    "Give a fact that can change the date it was said, as in '- Works as a nurse (2024-03-14)'; when "
    "the conversation changes a fact, rewrite it with the new value and date and keep the old value "
    "after it, as in '(previously: teacher, until 2024-03-14)'. "
    "In a group chat each user message starts with its sender's name: a fact is that person's, so name "
    "them ('- Alice works as a nurse'), never 'the user'."
)
CONSOLIDATION_OUTPUT = 2048  # tokens a consolidation answer may take (a whole MEMORY.md, rewritten)


class ConsolidationObserver(Protocol):
    """Told about every consolidation, summarized or raw fallback (``bot.metrics.Metrics`` counts them)."""

    def consolidation(self, *, fallback: bool) -> None: ...


@dataclass(slots=True)
class ConsolidationResult:
    """What a consolidation did. ``raw_fallback`` is True when the model's summary could not be used."""

    session_id: str
    archived: int = 0
    history_entry: str = ""
    memory_changed: bool = False
    memory_merged: bool = False  # the operator edited MEMORY.md meanwhile; the change was merged in
    raw_fallback: bool = False
    reason: str = ""
    parse_tier: int = 0
    facts: list[DurableFact] = field(default_factory=list)


def format_messages(messages: Sequence[Message], tz: ZoneInfo) -> str:
    """``[YYYY-MM-DD HH:MM] USER: …`` / ``ASSISTANT [tools: a, b]: …``; tool results are left out."""
    lines: list[str] = []
    for m in messages:
        if m.role is Role.TOOL or not (m.content or m.tool_calls):
            continue
        stamp = m.timestamp.astimezone(tz).strftime("%Y-%m-%d %H:%M")
        role = m.role.value.upper()
        if m.tool_calls:
            role += f" [tools: {', '.join(c.name for c in m.tool_calls)}]"
        text = m.content if len(m.content) <= MESSAGE_CHARS else m.content[:MESSAGE_CHARS] + "…"
        lines.append(f"[{stamp}] {role}: {text}")
    return "\n".join(lines)


def build_prompt(memory_text: str, conversation: str, *, max_memory_size: int) -> str:
    size = len(memory_text.encode("utf-8"))
    parts = [
        "## Current MEMORY.md",
        memory_text.strip() or "(empty)",
        "",
        "## Conversation to consolidate",
        conversation or "(no text messages)",
    ]
    if size > max_memory_size:
        parts += [
            "",
            f"MEMORY.md is {size} bytes, over its limit of {max_memory_size}: compress it, merge "
            "duplicates and prune stale facts so that memory_update fits the limit.",
        ]
    return "\n".join(parts)


class Consolidator:
    """Runs consolidations one at a time against the model, HISTORY and MEMORY.md."""

    def __init__(
        self,
        llm: ChatModel | None,
        longterm: LongTermMemory,
        history: HistoryLog,
        *,
        tz: ZoneInfo,
        clock: Callable[[], datetime],
        max_memory_size: int,
        max_fact_chars: int = MAX_FACT_CHARS,
        model: str | None = None,
        max_output_tokens: int = CONSOLIDATION_OUTPUT,
        observer: ConsolidationObserver | None = None,
        max_prompt_tokens: int | None = None,
        count: Callable[[str], int] | None = None,
    ) -> None:
        """``max_prompt_tokens`` (with ``count``): the model's window less the answer's room. A longer
        request would be refused, so the oldest messages are left out (the archive keeps them) and a
        MEMORY.md that leaves no room is a fallback with the reason, never an overflow."""
        self._room = max_prompt_tokens
        self._count = count
        self._llm = llm
        self._observer = observer
        self._longterm = longterm
        self._history = history
        self._tz = tz
        self._clock = clock
        self._max_memory_size = max_memory_size
        self._max_fact_chars = max_fact_chars
        self._model = model
        self._max_output_tokens = max_output_tokens
        self._queue = asyncio.Lock()
        self.last_run: datetime | None = None
        self.last_result: ConsolidationResult | None = None

    def _prompt_that_fits(
        self, memory_text: str, messages: Sequence[Message], result: ConsolidationResult
    ) -> str | None:
        """The prompt with as many of the newest messages as the window takes (None: not even MEMORY.md
        fits, and ``result`` says so)."""
        start = 0
        while True:
            conversation = format_messages(messages[start:], self._tz)
            prompt = build_prompt(memory_text, conversation, max_memory_size=self._max_memory_size)
            if self._room is None or self._count is None:
                return prompt
            if self._count(SYSTEM) + self._count(prompt) <= self._room:
                if start:
                    log.warning("consolidation_messages_left_out", left_out=start, kept=len(messages) - start)
                return prompt
            if start >= len(messages):
                result.raw_fallback = True
                result.reason = (
                    "MEMORY.md leaves no room in the model's window for a conversation: shrink it "
                    "(membot memory edit) or use a model with a larger window (memory.consolidation_model)"
                )
                return None
            start += max(1, (len(messages) - start) // 4)  # the oldest quarter of what is left

    def _local_now(self) -> datetime:
        """Now in the configured zone: a HISTORY heading and its month file follow the operator's
        calendar, as the daily notes do (in UTC, an evening in California was filed under the next
        day, and the last one of a month in the next month's file)."""
        return self._clock().astimezone(self._tz)

    async def run(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        timeout: float,
        longterm: LongTermMemory | None = None,
        journal: Journal | None = None,
        plan: Plan | None = None,
    ) -> ConsolidationResult:
        """Consolidate ``messages`` into HISTORY and ``longterm`` (default: the workspace MEMORY.md).

        ``journal`` is handed the plan before any of it is written; ``plan`` is one a killed run handed
        it, written again where it is missing, without asking the model (bot/memory/pending.py)."""
        result = ConsolidationResult(session_id)
        longterm = longterm or self._longterm
        resumed = plan is not None
        when = plan.when if plan is not None else self._local_now()
        planned = plan is not None  # a plan is journaled (a fallback journals one of its own)

        async def keep(decided: Plan) -> None:
            nonlocal planned
            planned = True
            if journal is not None:
                await journal(decided)

        deadline = asyncio.get_running_loop().time() + timeout
        try:
            if plan is not None:
                async with self._queue:  # no deadline: what the model decided is written, not dropped
                    await self._write(result, plan, longterm, keep, resumed=True)
            else:
                await self._consolidate(result, messages, when, deadline, longterm, keep)
        except TimeoutError:
            result.raw_fallback, result.reason = True, f"timed out after {timeout:g} s"
        except LLMError as exc:
            # The error's own text is the log's: a server may quote the request back, key and all, and
            # the reason is kept in HISTORY.md, which the model's tools read.
            log.warning("consolidation_llm_failed", session_id=session_id, error=str(exc))
            result.raw_fallback, result.reason = True, f"{type(exc).__name__}: {plain_reason(type(exc))}"
        except (Conflict, MemoryFull, NotUtf8, ReadOnly) as exc:
            result.raw_fallback, result.reason = True, str(exc)
        if result.raw_fallback:
            log.warning("consolidation_fallback", session_id=session_id, reason=result.reason)
            if not planned:
                await keep(Plan(when, "", facts=tuple(result.facts), reason=result.reason))
            entry = raw_fallback_entry(messages, result.reason)
            await self._history.append(when, session_id, entry, once=resumed)
        self.last_run, self.last_result = self._clock(), result
        if self._observer is not None:
            self._observer.consolidation(fallback=result.raw_fallback)
        return result

    async def _consolidate(
        self,
        result: ConsolidationResult,
        messages: Sequence[Message],
        when: datetime,
        deadline: float,
        longterm: LongTermMemory,
        journal: Journal,
    ) -> None:
        if self._llm is None:
            result.raw_fallback, result.reason = True, "no model configured for consolidation"
            return
        async with asyncio.timeout_at(deadline):
            await self._queue.acquire()
        try:  # held until written: the next consolidation reads the MEMORY.md this one leaves
            plan = await self._plan(self._llm, result, messages, when, deadline, longterm)
            if plan is not None:
                await journal(plan)
                await self._write(result, plan, longterm, journal, resumed=False)
        finally:
            self._queue.release()

    async def _plan(
        self,
        llm: ChatModel,
        result: ConsolidationResult,
        messages: Sequence[Message],
        when: datetime,
        deadline: float,
        longterm: LongTermMemory,
    ) -> Plan | None:
        """The model's answer as a plan, or None with ``result`` saying why it cannot be used."""
        base = await longterm.read()
        # (past what the bot reads, the model sees no more of MEMORY.md than a turn's prompt shows)
        shown = base.text if base.whole else base.text[: longterm.max_bytes]
        prompt = self._prompt_that_fits(shown, messages, result)
        if prompt is None:
            return None
        remaining = max(0.1, deadline - asyncio.get_running_loop().time())
        request = ChatRequest(
            messages=(Message(Role.USER, prompt),),
            system=SYSTEM,
            model=self._model,
            max_output_tokens=self._max_output_tokens,
            temperature=0.2,
            timeout=remaining,
            purpose="consolidation",
        )
        async with asyncio.timeout_at(deadline):
            response = await llm.chat(request)
        if response.refused:  # whatever came before it stopped, the model did not give this answer
            result.raw_fallback = True
            result.reason = "the model declined to consolidate these messages; none of its answer was used"
            return None
        if response.cut_off:
            result.raw_fallback = True
            result.reason = (
                f"the model's answer was cut at the output limit ({self._max_output_tokens} tokens, "
                f"stop reason {response.stop_reason!r}); none of it was used"
            )
            return None
        reply = parse_reply(response.content, max_fact_chars=self._max_fact_chars)
        if reply is None:
            result.raw_fallback, result.reason = True, "the model's answer held no usable JSON"
            return None
        # A MEMORY.md past what the bot reads (longterm.py) showed the model only its start: its
        # memory_update is no file to write, and refusing it would drop the history entry too.
        problem = memory_problem(reply, base.text, max_bytes=longterm.max_bytes) if base.whole else None
        if problem:  # MEMORY.md stays as it is; the messages are kept verbatim instead
            result.raw_fallback, result.reason = True, f"memory_update refused: {problem}"
            return None
        memory = (reply.memory_update or "").strip()
        # (in the file's line endings and BOM, as it would be written: the model writes LF lines)
        changed = base.whole and bool(memory) and in_style_of(base.text, memory).strip() != base.text.strip()
        if changed and not base.writable:  # the operator froze it: the entry and the facts still go in
            read_only_refused(longterm.path, "a consolidation")
            changed = False
        if not reply.history_entry and not changed:  # nothing would be written for these messages
            result.raw_fallback = True
            result.reason = "the model's answer was blank: no history entry and no change to MEMORY.md"
            # The answer is whole, only without a summary: the facts it found are kept beside the
            # messages written verbatim (they were dropped with the rest).
            result.facts = list(reply.facts)
            return None
        return Plan(
            when,
            reply.history_entry,
            base.text if changed else None,
            reply.memory_update.rstrip("\n") + "\n" if changed and reply.memory_update else "",
            tuple(reply.facts),
            reply.tier,
        )

    async def _write(
        self,
        result: ConsolidationResult,
        plan: Plan,
        longterm: LongTermMemory,
        journal: Journal,
        *,
        resumed: bool,
    ) -> None:
        """Write ``plan``; ``resumed`` skips what a killed run wrote of it already. Once the HISTORY
        entry and MEMORY.md are written, that is journaled too: the operator may edit either before a
        resume, which must not undo it (an entry they corrected or removed is no longer found as written,
        and was appended again beside their text)."""
        if plan.reason:  # a raw fallback: :meth:`run` writes its entry (and the caller the facts it kept)
            result.raw_fallback, result.reason, result.facts = True, plan.reason, list(plan.facts)
            return
        result.parse_tier, result.facts = plan.parse_tier, list(plan.facts)
        memory_done = (
            resumed
            and plan.base is not None
            and (plan.memory_written or _written(plan, (await longterm.read()).text))
        )
        if plan.entry:
            result.history_entry = plan.entry
            # MEMORY.md is written after the entry: once it is, so was the entry (journaled or not).
            if not (resumed and (plan.history_written or memory_done)):
                await self._history.append(plan.when, result.session_id, plan.entry, once=resumed)
                plan = replace(plan, history_written=True)
                await journal(plan)
        if plan.base is None:
            return
        if not memory_done:
            base = Snapshot(plan.base, content_hash(plan.base))
            _, result.memory_merged = await longterm.replace_from(base, plan.memory)
            await journal(replace(plan, memory_written=True))
        result.memory_changed = True


def _written(plan: Plan, current: str) -> bool:
    """Whether MEMORY.md (``current``) looks written from ``plan`` by a run killed before it could
    journal so: it is no longer the text the model read.

    The other way it moves is an operator's edit while the bot was down, which writing the plan again
    would undo (their correction of a line the bot added would get that line back beside it). The two
    cannot be told apart, so it errs towards "written": what can be lost is the bot's change (killed in
    the moment before its write, with an operator edit before the next start), never the operator's."""
    return current != plan.base
