"""The context budget: the one place that decides what a model request may hold, and what happens when a
conversation outgrows it.

A request is the system prompt (base prompt + ``# Memory``), the tool schemas, the history, and room
for the answer (``max_output_tokens``). Invariant, for every request the bot sends::

    request tokens + max output tokens <= the model's window

:class:`ContextBudget` owns every part of that:

- the **reserve**: what is spent before any history — the answer's room, the tool schemas, the base
  prompt, a safety margin for the estimate, and the memory section, which takes its configured caps
  (MEMORY.md, pack, notes) but never more than half of what is left (a small window keeps room to talk);
- the **estimate** of a session's next prompt, calibrated per session against the usage the provider
  reports (bot/tokens.py);
- **compaction**, from all four places that trigger it: before a turn when the history crowds the
  reserve (AutoCompaction), when the provider refused a request as too long (the tool loop's retry),
  ``/compact``, and the retirement of a whole conversation on ``/new``;
- **trimming**, the last resort: a request that still would not fit (one enormous message, a tool result
  that filled the window mid-turn) is cut in what is sent — oldest history first but never the turn's
  own messages, then the middle of the longest messages — never in the session itself (bot/request_trim.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from bot.compaction import CompactionResult, CompactionService, Retirer
from bot.config import CompactionSettings
from bot.domain import Message, Session
from bot.llm import ChatRequest, ToolSpec, request_tokens, schemas_text
from bot.request_trim import cut_text, trim_messages
from bot.tokens import TokenCounter

log = structlog.get_logger(__name__)

META_OVERHEAD = "prompt_overhead_tokens"  # session.metadata: basis tokens of the last system prompt
AFTER_FRACTION = 0.5  # after compacting, aim to use at most this share of the compaction threshold
# ...of which the recent messages get at least this share whatever the memory reserve (the memory section
# shrinks to fit beside them: memory_budget), or a small window kept only the newest message.
RECENT_FRACTION = 0.25
MARGIN_SHARE = 0.02  # of the window, for the estimate's error (on top of per-session calibration)
MIN_MARGIN = 32
SEPARATOR_TOKENS = 2  # between the base prompt and the memory section ("\n\n" is one token; one spare)


def margin_for(window: int) -> int:
    """Tokens kept free for the estimate's error (on top of per-session calibration)."""
    return max(MIN_MARGIN, int(window * MARGIN_SHARE))


def prompt_room(window: int, output: int) -> int:
    """What a request's input may hold in a ``window`` when ``output`` tokens are kept for the answer."""
    return max(0, window - output - margin_for(window))


@dataclass(frozen=True, slots=True)
class Reserve:
    """Tokens spent before any history, as :class:`ContextBudget` plans a request."""

    window: int
    output: int
    tools: int
    base: int
    margin: int
    memory: int

    @property
    def room(self) -> int:
        """What the system prompt and the history may use together."""
        return max(0, self.window - self.output - self.tools - self.margin)


class ContextBudget:
    """Plans, checks and (when it must) trims every request of a model with ``window`` tokens.

    ``memory_cap`` is what the memory section asks for at most (its configured caps added up).

        budget = ContextBudget(counter, compaction, retirer, settings.compaction, window=8192,
                               max_output_tokens=2048, base_prompt=prompt, tools=specs, memory_cap=5000)
        budget.memory_budget(session)          # ContextBuilding: tokens # Memory may use
        await budget.prepare(session)          # AutoCompaction: compact when the history crowds the reserve
        request = budget.fit(request, session) # the tool loop, before every call
    """

    def __init__(
        self,
        counter: TokenCounter,
        compaction: CompactionService,
        retirer: Retirer,
        settings: CompactionSettings,
        *,
        window: int,
        max_output_tokens: int,
        base_prompt: str = "",
        tools: Sequence[ToolSpec] = (),
        memory_cap: int = 0,
    ) -> None:
        self._counter = counter
        self._compaction = compaction
        self._retirer = retirer
        self._settings = settings
        self.window = window
        self.output = max(1, min(max_output_tokens, window // 2))
        self._tools = counter.count_text(schemas_text(tools)) if tools else 0
        self._base = counter.count_text(base_prompt)
        self._margin = margin_for(window)
        room = max(0, window - self.output - self._tools - self._margin)
        self._memory = max(0, min(memory_cap, (room - self._base) // 2))

    @property
    def counter(self) -> TokenCounter:
        return self._counter

    @property
    def enabled(self) -> bool:
        return self._settings.enabled

    @property
    def reserve(self) -> Reserve:
        return Reserve(self.window, self.output, self._tools, self._base, self._margin, self._memory)

    @property
    def limit(self) -> int:
        """Prompt tokens (system + history) above which a turn compacts first."""
        return int(self._settings.threshold * self.reserve.room)

    # -- planning ---------------------------------------------------------------------------------

    def history_tokens(self, session: Session) -> int:
        return self._counter.scale(session, self._counter.history_tokens(session))

    async def estimate(self, session: Session) -> int:
        """Calibrated tokens of the next prompt: the last system prompt seen (or the reserve) + history."""
        seen = session.metadata.get(META_OVERHEAD)
        overhead = int(seen) if isinstance(seen, int) and seen >= 0 else self._base + self.memory_for(session)
        raw = await self._counter.count_history(session) + max(overhead, self._base)
        return self._counter.scale(session, raw)

    async def in_use(self, session: Session) -> int:
        """What /status shows: calibrated tokens of the next request as far as they are known, the last
        system prompt (the base prompt before any turn), the history and the tool definitions. Unlike
        :meth:`estimate` it never counts the memory reserve a turn has not filled."""
        seen = session.metadata.get(META_OVERHEAD)
        overhead = int(seen) if isinstance(seen, int) and seen >= 0 else self._base
        raw = await self._counter.count_history(session) + max(overhead, self._base)
        return self._counter.scale(session, raw + self._tools)  # schemas are basis tokens too

    def memory_for(self, session: Session) -> int:
        """The memory section's reserve for ``session``, in basis tokens: half the room, as the model
        counts it. The room is the model's tokens; a model that counts more tokens than the basis (an
        estimate's ratio above 1: Anthropic, local models) fits fewer basis tokens in it. Planned in
        basis tokens, the section took more than half the room, the compaction's recent messages no
        longer fitted under its threshold beside it, and a small window compacted nearly every turn
        (120 times in 150 turns at a ratio of 1.3, against 13 at 1.0)."""
        ratio = self._counter.ratio(session)
        if ratio <= 1.0:
            return self._memory
        half = (self.reserve.room - self._counter.scale(session, self._base)) // 2
        return max(0, min(self._memory, int(half / ratio)))

    def memory_budget(self, session: Session) -> int:
        """Tokens the ``# Memory`` section may use this turn (basis tokens): its reserve, less whatever
        the history needs beyond its own share (so the request fits even before compaction has caught up)."""
        free = self.reserve.room - self._counter.scale(session, self._base) - self.history_tokens(session)
        return max(0, min(self.memory_for(session), int(free / self._counter.ratio(session))))

    def keep_for(self, session: Session) -> int:
        """How many recent messages a compaction keeps: ``keep_last``, or fewer if they would not fit."""
        # (in the model's tokens, as the threshold is: the base, the memory and the summary are counted
        # in the basis, and the history's tokens below are scaled)
        reserved = (
            self._base + self.memory_for(session) + min(self._settings.summary_max_tokens, self.limit // 10)
        )
        budget = int(self.limit * AFTER_FRACTION) - self._counter.scale(session, reserved)
        budget = max(budget, int(self.limit * RECENT_FRACTION))
        used = kept = 0
        for message in reversed(session.messages):
            used += self._counter.scale(session, self._counter.message_tokens(message))
            if kept and used > budget:
                break
            kept += 1
            if kept >= self._settings.keep_last:
                break
        return max(1, kept)

    # -- compaction, from every place that triggers it --------------------------------------------

    async def prepare(self, session: Session, *, keep_at_least: int = 1) -> CompactionResult | None:
        """Before a turn: compact when the next prompt would pass the threshold (None: no need).
        ``keep_at_least``: the turn's own messages, which stay."""
        estimate = await self.estimate(session)
        if not self.enabled or estimate <= self.limit:
            return None
        log.info("compaction_triggered", estimated=estimate, limit=self.limit, window=self.window)
        keep = max(keep_at_least, self.keep_for(session))
        return await self._compaction.compact(session, keep_last=keep, trigger="threshold")

    async def on_overflow(
        self,
        session: Session,
        system_prompt: str,
        attempt: int,
        *,
        keep_at_least: int = 1,
        refused: bool = True,
    ) -> bool:
        """The provider refused a request as too long (``refused``): trust our estimate less, compact
        harder. Without ``refused`` (our own check found the request over the window) the estimate is
        left as it is: raised there from itself, a ratio raised once by a refusal kept itself up and
        compacted every later turn, never to come down.

        Returns whether room was made, by compacting or by raising the estimate (the caller retries
        only then, at most ``max_overflow_retries`` times a turn). With compaction disabled nothing is
        compacted and the error reaches the user.
        """
        if not self.enabled:
            return False
        raw = await self._counter.count_history(session) + self._counter.count_text(system_prompt)
        raised = refused and self._counter.note_overflow(session, raw, self.window - self.output) is not None
        keep = max(keep_at_least, self.keep_for(session) >> (attempt - 1))
        log.warning("compaction_on_overflow", attempt=attempt, keep_last=keep, estimated_raw=raw)
        result = await self._compaction.compact(session, keep_last=keep, trigger="overflow")
        # Room is made by the compaction, or by the raised estimate itself: the retry's fit() trims
        # what the model would not take. (A chat too short to compact went unanswered.)
        return result.performed or raised

    async def compact(
        self, session: Session, *, keep_last: int, trigger: str = "command"
    ) -> CompactionResult:
        """``/compact``: summarize all but the last ``keep_last`` messages now."""
        return await self._compaction.compact(session, keep_last=keep_last, trigger=trigger)

    async def retire_all(self, session: Session) -> bool:
        """``/new``: hand the whole conversation to memory; ``False`` if it could not be saved (keep it)."""
        return not session.messages or await self._retirer.retire(session, list(session.messages))

    def observe(self, session: Session, system_prompt: str, *, actual_input_tokens: int | None,
                replies: Sequence[Message]) -> None:  # fmt: skip
        """After a turn: remember the system prompt's size, and calibrate against the provider's count
        when one call's ``input_tokens`` is exactly the prompt we can reconstruct."""
        overhead = self._counter.count_text(system_prompt)
        session.metadata[META_OVERHEAD] = overhead
        if actual_input_tokens:
            history = self._counter.history_tokens(session)
            # The provider counts the tool schemas it was sent too: left out here, the ratio came out
            # too high (by a third on a short chat) and every later estimate, /status's too, with it.
            prompt_raw = self._tools + overhead + history
            prompt_raw -= sum(self._counter.message_tokens(m) for m in replies)
            ratio = self._counter.calibrate(session, prompt_raw, actual_input_tokens)
            if ratio is not None:
                log.debug("token_ratio", ratio=ratio, estimated=prompt_raw, actual=actual_input_tokens)

    def counted_prompt(self, system_prompt: str, memory_tokens: int) -> None:
        """A turn's system prompt is the base prompt + the memory section, whose ``memory_tokens`` memory
        summed part by part as it fitted them: their sum is remembered as the prompt's count, so checking
        the request does not encode the whole prompt once more."""
        if memory_tokens > 0:
            self._counter.remember(system_prompt, self._base + SEPARATOR_TOKENS + memory_tokens)

    # -- the invariant ----------------------------------------------------------------------------

    def request_tokens(self, request: ChatRequest, session: Session | None = None) -> int:
        """Calibrated tokens of a request as sent: system prompt, tool schemas and messages."""
        raw = request_tokens(self._counter, request)  # (as a call the server did not count is estimated)
        return self._counter.scale(session, raw) if session is not None else raw

    def fit(self, request: ChatRequest, session: Session | None = None, *, keep: int = 1) -> ChatRequest:
        """``request``, cut if it must be so that it and the answer fit the window (see the module doc).

        ``keep``: the newest messages that are cut rather than left out (a turn's own: the question it
        answers and its tool calls). The request's ``max_output_tokens`` is set to the budget's, so the
        promise holds for what is sent.
        """
        request = dataclasses.replace(request, max_output_tokens=self.output)
        limit = self.window - self.output - self._margin
        if self.request_tokens(request, session) <= limit:
            return request
        ratio = self._counter.ratio(session) if session is not None else 1.0
        raw_limit = int(limit / max(ratio, 1e-6))
        fixed = self._counter.count_text(schemas_text(request.tools)) if request.tools else 0
        system = request.system
        # The system prompt may keep at most half of what is left once the schemas are paid for.
        system_room = max(0, (raw_limit - fixed) // 2)
        if self._counter.count_text(system) > system_room:
            system = cut_text(system, system_room, self._counter)
        room = raw_limit - fixed - (self._counter.count_text(system) if system else 0)
        messages = trim_messages(list(request.messages), room, self._counter, keep=keep)
        log.warning(
            "request_trimmed",
            messages_before=len(request.messages),
            messages_after=len(messages),
            system_cut=system != request.system,
            window=self.window,
        )
        return dataclasses.replace(request, system=system, messages=tuple(messages))
