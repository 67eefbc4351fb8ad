"""Compaction: older messages leave the active context as one summary, after memory has saved them.

One compaction:

1. Choose the cut: keep the last N messages, moving the cut earlier so that an assistant message with
   tool calls and its tool results stay together (a tool call and its result are never split).
2. Hand the older messages to the :class:`Retirer` (memory: archive + consolidation) and, at the same
   time, ask the ``balanced`` model for a summary of them. Nothing is removed before the retirer
   confirmed: if it fails, the session stays as it was.
3. Replace the older messages with one ``system`` message starting ``[Conversation summary]``. When
   the model fails, declines (a refusal, a content filter: its words are no summary) or answers
   empty/garbage, fall back to plain truncation (the last N messages, plus the previous summary if
   there was one), log it, and record it on the session for ``/status``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from bot.config import CompactionSettings
from bot.domain import Message, Role, Session, utcnow
from bot.errors import plain_reason
from bot.llm import ChatRequest
from bot.tokens import TokenCounter

if TYPE_CHECKING:  # bot.llm's client loads httpx; only the type is needed here
    from bot.llm import ChatModel

log = structlog.get_logger(__name__)

SUMMARY_PREFIX = "[Conversation summary]"
MESSAGE_CHARS = 300  # per message, in the summary prompt
META_LAST = "compaction"  # session.metadata: what the last compaction did (for /status)
MIN_SUMMARY_CHARS = 20

SUMMARY_SYSTEM = (
    "You compress the older part of a chat between a user and an assistant so the assistant can "
    "continue without it. Write terse bullet points, no preamble. Keep, verbatim where possible:\n"
    "- decisions made and their reasons;\n"
    "- open TODOs and tasks in progress;\n"
    "- constraints and preferences the user stated;\n"
    "- questions or requests from the user that are still pending;\n"
    "- exact identifiers: names, numbers, dates, amounts, file paths, URLs, ids, commands.\n"
    "If a previous summary is given, merge it in: the result replaces it. Drop small talk. "
    "Never invent anything that is not in the text. Answer with the summary only."
)


class Retirer(Protocol):
    """Saves messages that are about to leave a session (archive + memory consolidation).

    Returns ``True`` once they are saved somewhere; ``False`` (or raising) keeps them in the session.
    """

    async def retire(self, session: Session, messages: Sequence[Message]) -> bool: ...


class CompactionObserver(Protocol):
    """Told about every compaction that removed messages (``bot.metrics.Metrics`` counts them)."""

    def compaction(self, *, fallback: bool) -> None: ...


class _Consolidation(Protocol):
    @property
    def raw_fallback(self) -> bool: ...


class _Consolidates(Protocol):
    async def consolidate(
        self, session_id: str, messages_to_retire: Sequence[Message], *, timeout: float | None = None
    ) -> _Consolidation: ...


class MemoryRetirer:
    """A :class:`Retirer` over the memory service's awaited ``consolidate`` (archive, then HISTORY).

    A consolidation that times out or fails still archives and writes a raw-fallback HISTORY entry,
    so it counts as saved; only an exception (the archive could not be written) refuses retirement.
    """

    def __init__(self, memory: _Consolidates, *, timeout: float) -> None:
        self._memory = memory
        self._timeout = timeout

    async def retire(self, session: Session, messages: Sequence[Message]) -> bool:
        try:
            result = await self._memory.consolidate(session.id, list(messages), timeout=self._timeout)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("retire_failed", session_id=session.id, messages=len(messages))
            return False
        if result.raw_fallback:
            log.warning("retire_raw_fallback", session_id=session.id, messages=len(messages))
        return True


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What one compaction did. ``fallback``: truncation was used instead of a summary."""

    performed: bool
    removed: int = 0
    kept: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    fallback: bool = False
    reason: str = ""


def is_summary(message: Message) -> bool:
    return message.role is Role.SYSTEM and message.content.startswith(SUMMARY_PREFIX)


def cut_index(messages: Sequence[Message], keep_last: int) -> int:
    """Where to cut so that about ``keep_last`` messages stay; 0 means nothing can go.

    The cut never lands on a tool result: it moves earlier (keeping the assistant message that made
    the call together with all its results). Only if that reaches the start does it move later
    instead, retiring the whole group.
    """
    keep_last = max(1, keep_last)
    if len(messages) <= keep_last:
        return 0
    cut = len(messages) - keep_last
    back = cut
    while back > 0 and messages[back].role is Role.TOOL:
        back -= 1
    if back > 0:
        return back
    forward = cut
    while forward < len(messages) and messages[forward].role is Role.TOOL:
        forward += 1
    return forward if forward < len(messages) else 0


def summary_prompt(messages: Sequence[Message], fits: Callable[[str], bool] | None = None) -> str:
    """The text the summarizer reads: tool results left out, each message cut to 300 characters.

    ``fits`` says whether a prompt fits the summary model's window; the oldest lines go first until it
    does (they are in memory's archive either way, and the previous summary stays).
    """
    previous = [m.content[len(SUMMARY_PREFIX) :].strip() for m in messages if is_summary(m)]
    lines: list[str] = []
    for m in messages:
        if m.role is Role.TOOL or is_summary(m):
            continue
        text = " ".join(m.content.split())
        if len(text) > MESSAGE_CHARS:
            text = text[: MESSAGE_CHARS - 1] + "…"
        label = m.role.value.upper()
        if m.tool_calls:
            text = (text + " " if text else "") + f"(called tools: {', '.join(c.name for c in m.tool_calls)})"
        if text:
            lines.append(f"{label}: {text}")
    head = ["## Previous summary", previous[-1], ""] if previous else []

    def build(kept: Sequence[str], dropped: int) -> str:
        note = [f"({dropped} older messages left out: too long for one summary)"] if dropped else []
        return "\n".join([*head, "## Conversation", *note, "\n".join(kept) or "(no text messages)"])

    text = build(lines, 0)
    if fits is None or fits(text):
        return text
    low, high = 0, len(lines)  # the most recent lines that fit, by binary search on how many to drop
    while low < high:
        drop = (low + high) // 2
        if fits(build(lines[drop:], drop)):
            high = drop
        else:
            low = drop + 1
    return build(lines[low:], low)


def clean_summary(text: str, max_chars: int) -> str | None:
    """The usable summary text, or ``None`` when it is empty or garbage."""
    body = text.strip()
    if body.startswith(SUMMARY_PREFIX):
        body = body[len(SUMMARY_PREFIX) :].strip()
    if body.startswith("```") and body.endswith("```"):
        body = body.strip("`").strip()
    letters = sum(ch.isalpha() for ch in body)
    if len(body) < MIN_SUMMARY_CHARS or letters < len(body) * 0.3:
        return None
    if len(body) > max_chars:
        body = body[: max_chars - 1].rstrip() + "…"
    return body


class CompactionService:
    """Runs compactions (see the module doc). Callers hold the session (a turn, or ``exclusive``) and
    save it afterwards.

        result = await compaction.compact(session, keep_last=10, trigger="command")
    """

    def __init__(
        self,
        llm: ChatModel,
        counter: TokenCounter,
        retirer: Retirer,
        settings: CompactionSettings,
        *,
        summary_model: str | None,
        clock: Callable[[], datetime] = utcnow,
        max_prompt_tokens: int | None = None,
        observer: CompactionObserver | None = None,
    ) -> None:
        """``max_prompt_tokens``: the most the summary request's input may hold (its model's window less
        the summary's own room); older messages are left out of the summary input beyond it."""
        self._llm = llm
        self._observer = observer
        self._max_prompt = max_prompt_tokens
        self._counter = counter
        self._retirer = retirer
        self._settings = settings
        self._summary_model = summary_model
        self._clock = clock

    @property
    def counter(self) -> TokenCounter:
        return self._counter

    def tokens(self, session: Session) -> int:
        return self._counter.scale(session, self._counter.history_tokens(session))

    async def compact(
        self, session: Session, *, keep_last: int | None = None, trigger: str = "auto"
    ) -> CompactionResult:
        keep = keep_last if keep_last is not None else self._settings.keep_last
        messages = list(session.messages)
        cut = cut_index(messages, keep)
        retiring, kept = messages[:cut], messages[cut:]
        if not any(not is_summary(m) for m in retiring):
            return CompactionResult(False, kept=len(messages), reason="nothing older to compact")
        before = self.tokens(session)
        saved, summary = await asyncio.gather(self._retire(session, retiring), self._summarize(retiring))
        if not saved:
            log.error("compaction_aborted", session_id=session.id, reason="memory could not save them")
            return CompactionResult(
                False, kept=len(messages), tokens_before=before, tokens_after=before,
                reason="the messages could not be saved to memory, so none were removed",
            )  # fmt: skip
        text, why = summary
        head: list[Message]
        if text is not None:
            head = [Message(Role.SYSTEM, f"{SUMMARY_PREFIX}\n{text}", meta={"summary": True})]
        else:
            head = [m for m in retiring[:1] if is_summary(m)]  # truncation keeps the older summary
        session.replace_messages(head + kept)
        session.compactions += 1
        after = self.tokens(session)
        result = CompactionResult(
            True, removed=len(retiring), kept=len(kept), tokens_before=before, tokens_after=after,
            fallback=text is None, reason=why,
        )  # fmt: skip
        session.metadata[META_LAST] = _record(result, trigger, self._clock())
        if self._observer is not None:
            self._observer.compaction(fallback=result.fallback)
        log_event = log.warning if result.fallback else log.info
        log_event(
            "compacted",
            summary=f"removed {result.removed} messages, kept {result.kept}, tokens {before}→{after}",
            session_id=session.id,
            trigger=trigger,
            fallback=result.fallback,
            reason=why or None,
        )
        return result

    async def _retire(self, session: Session, messages: Sequence[Message]) -> bool:
        try:
            return await self._retirer.retire(session, messages)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("retire_failed", session_id=session.id)
            return False

    def _fits(self, prompt: str) -> bool:
        if self._max_prompt is None:
            return True
        counter = self._counter
        return counter.count_text(SUMMARY_SYSTEM) + counter.count_text(prompt) + 16 <= self._max_prompt

    async def _summarize(self, messages: Sequence[Message]) -> tuple[str | None, str]:
        """(summary text or None, reason for the fallback)."""
        s = self._settings
        request = ChatRequest(
            messages=(Message(Role.USER, summary_prompt(messages, self._fits)),),
            system=SUMMARY_SYSTEM,
            model=self._summary_model,
            max_output_tokens=s.summary_max_tokens,
            temperature=0.3,
            timeout=s.summary_timeout,
            purpose="compaction",
        )
        try:
            async with asyncio.timeout(s.summary_timeout):
                response = await self._llm.chat(request)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            return None, f"the summary took longer than {s.summary_timeout:g} s"
        except Exception as exc:  # any failure of the summarizer must still make room
            log.warning("compaction_summary_failed", error=f"{type(exc).__name__}: {exc}")
            # Shown in the chat (/compact, /status): plain words, the exception's name is in the log.
            return None, f"the summary failed: {plain_reason(type(exc))}"
        if response.refused:  # its text is a refusal, or what came before the model stopped
            log.warning(
                "compaction_summary_refused",
                model=response.model,
                stop_reason=response.stop_reason,
                refusal=response.refusal,
            )
            return None, "the model declined to summarize"
        if response.cut_off:  # its end, usually the newest facts, is missing: no summary beats half of one
            return None, "the summary was cut at its output limit"
        text = clean_summary(response.content, max_chars=s.summary_max_tokens * 6)
        if text is None:
            return None, "the summary was empty or unusable"
        return text, ""


def _record(result: CompactionResult, trigger: str, when: datetime) -> dict[str, Any]:
    return {
        "at": when.isoformat(timespec="seconds"),
        "trigger": trigger,
        "removed": result.removed,
        "kept": result.kept,
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
        "fallback": result.fallback,
        "reason": result.reason,
    }
