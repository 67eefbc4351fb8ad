"""The session commands /status, /compact [N] and /new (the router, /help and /stop are in the package).

They are registered by the composition root, next to the services they report on::

    cmds = SessionCommands(sessions, budget, model=info, tier=tier, ledger=ledger,
                           admins=Admins(frozenset({("telegram", "42")}), local=frozenset({"cli"})),
                           memory_stats=lambda: memory_operator.stats(memory))
    router.add("status", "Model, context, usage and memory of this chat", cmds.status)
    router.add("compact", "Summarize older messages now: /compact [N] keeps the last N", cmds.compact)
    router.add("new", "Save this conversation to memory and start a fresh one", cmds.new)

``memory_stats_for`` instead takes the chat's session id, so /status can report that chat's own memory
(``memory.scope = "chat"``)::

    memory_stats_for=lambda sid: memory_operator.stats(memory, session_id=sid)

/compact and /new change the session, so they run under ``control.exclusive``: they wait for a running
turn to end and for the messages sent before them to be answered (the chat is told, and may /stop it
meanwhile; a restart meanwhile does not lose them) and keep new turns out until they are done.
Both go through the context budget (bot/context_budget.py), like every other compaction.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import structlog

from bot.catalog import ModelInfo
from bot.compaction import META_LAST
from bot.context_budget import ContextBudget
from bot.domain import InboundMessage, Session, Usage
from bot.errors import StorageError
from bot.session_service import SessionService
from bot.usage import META_ANSWERED_BY, UsageLedger

if TYPE_CHECKING:  # the package imports this module to export SessionCommands
    from bot.commands import CommandCall, SessionControl

log = structlog.get_logger(__name__)

COMPACT_DEFAULT = 10
COMPACT_RANGE = (1, 100)
NEW_STORAGE_NOTICE = (
    "⚠️ Your conversation is saved to memory, but I can't save the fresh start right now (a problem on "
    "the server). I'll finish /new as soon as I can — nothing is lost."
)
COMPACT_STORAGE_NOTICE = (
    "⚠️ The older messages are saved to memory, but I can't save the compacted conversation right now "
    "(a problem on the server). I'll finish /compact as soon as I can — nothing is lost."
)
# Items waiting for their vector from which /status mentions it: every turn queues a few for a moment
# (they are embedded together once the chat pauses); past this, an import or a new model's reindex runs.
BACKLOG_SHOWN = 20
COMPACT_USAGE = "Usage: /compact [N] — summarize older messages and keep the last N (1–100, default 10)."


class MemoryFigures(Protocol):
    """What /status shows about memory (``bot.memory.operator.MemoryStats`` has these)."""

    @property
    def memory_md_bytes(self) -> int: ...

    @property
    def today_notes(self) -> int: ...

    @property
    def items(self) -> Mapping[str, int]: ...

    @property
    def last_recall(self) -> Mapping[str, object] | None: ...

    @property
    def vectors_waiting(self) -> int | None: ...

    @property
    def vectors_failing(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Admins:
    """Who sees the operator's figures in /status: the day's usage and cost across all chats (what the
    provider bills the operator) and its split by purpose. Anyone else admitted sees their own chat's
    tokens only: what the bot costs is the operator's business.

    ``users``: ``(channel, user id)`` pairs (``<channel>.admin_users``); ``local``: channels whose user
    is at the machine itself (the terminal). Never in a group: the whole group reads the answer."""

    users: frozenset[tuple[str, str]] = frozenset()
    local: frozenset[str] = frozenset()

    def of(self, message: InboundMessage) -> bool:
        if message.is_group:
            return False
        return message.channel in self.local or (message.channel, message.sender_id) in self.users


class SessionCommands:
    """Handlers for /status, /compact and /new (see the module doc for registration)."""

    def __init__(
        self,
        sessions: SessionService,
        budget: ContextBudget,
        *,
        model: ModelInfo,
        tier: str | None = None,
        ledger: UsageLedger | None = None,
        admins: Admins = Admins(),
        memory_stats: Callable[[], Awaitable[MemoryFigures]] | None = None,
        memory_stats_for: Callable[[str], Awaitable[MemoryFigures]] | None = None,
        started_at: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sessions = sessions
        self._budget = budget
        self._model = model
        self._tier = tier
        self._ledger = ledger
        self._admins = admins
        self._memory_stats = memory_stats
        self._memory_stats_for = memory_stats_for
        self._monotonic = monotonic
        self._started = monotonic() if started_at is None else started_at

    # -- /status ------------------------------------------------------------------------------------

    async def status(self, call: CommandCall, control: SessionControl) -> str:
        sid = call.session_id
        admin = self._admins.of(call.message)
        try:
            session: Session | None = await self._sessions.get(sid)
            readable = True
        except StorageError:  # a status line must not take /status down; the operator gets the details
            log.warning("status_session_unreadable", session_id=sid, exc_info=True)
            session, readable = None, False
        m = self._model
        tier = f", {self._tier} tier" if self._tier else ""
        lines = [f"Model: {m.display_name or m.id} ({m.id}{tier})"]
        answered_by = session.metadata.get(META_ANSWERED_BY) if session is not None else None
        if isinstance(answered_by, str) and answered_by != m.id:  # the model line alone hid a failover
            lines.append(f"Last answer: from the fallback model {answered_by} ({m.id} was not answering)")
        if not readable:
            lines.append("Messages: unknown for now (the server's disk cannot be read)")
        elif session is None:
            lines.append("Messages: 0 (no conversation yet)")
        else:
            lines += await self._session_lines(session, admin=admin)
        if self._ledger is not None and admin:
            try:
                today, purposes = await self._ledger.day(), await self._ledger.purposes()
            except StorageError:  # a newer membot's usage.json: the log says what to do
                lines.append("Today (all chats): unknown (the usage ledger cannot be read; see the log)")
            else:
                lines.append(f"Today (all chats): {_usage_line(today)} · {_calls(today.calls)}")
                split = _purposes_line(purposes)
                if split:
                    lines.append(f"  by use: {split}")
        if self._memory_stats is not None or self._memory_stats_for is not None:
            lines.append(await self._memory_line(sid))
        else:
            lines.append("Memory: off")
        running = "answering now" if control.is_running(sid) else "idle"
        if (next_try := control.model_wait(sid)) is not None:
            running = f"waiting for the AI model (next try in {_duration(next_try)})"
        held = control.storage_wait(sid)
        if held is not None:  # (it said "idle" while an answer waited for the disk)
            doing = "read" if held == "session_load" else "save"
            running = f"waiting for the server's disk to {doing} this chat (it goes on by itself once it can)"
        lines.append(f"Queue: {control.queue_depth(sid)} waiting · {running}")
        lines.append(f"Uptime: {_duration(self._monotonic() - self._started)}")
        return "\n".join(lines)

    async def _session_lines(self, session: Session, *, admin: bool) -> list[str]:
        used = await self._budget.in_use(session)
        window = self._budget.window
        approx = "" if self._budget.counter.exact else "≈"
        lines = [
            f"Messages: {len(session.messages)}",
            f"Context: {approx}{_tokens(used)} / {_tokens(window)} tokens ({used * 100 / window:.0f}%)",
        ]
        compactions = f"Compactions: {session.compactions}"
        last = session.metadata.get(META_LAST)
        if isinstance(last, dict) and session.compactions:
            if last.get("fallback"):
                compactions += f" (last one fell back to truncation: {last.get('reason') or 'no summary'})"
            else:
                compactions += " (last one summarized)"
        lines.append(compactions)
        lines.append(f"This chat: {_usage_line(session.usage, cost=admin)}")
        return lines

    async def _memory_line(self, sid: str) -> str:
        try:
            if self._memory_stats_for is not None:
                figures = await self._memory_stats_for(sid)
            else:
                assert self._memory_stats is not None
                figures = await self._memory_stats()
        except Exception:  # a status line must not take /status down; the operator gets the details
            log.exception("status_memory_failed", session_id=sid)
            return "Memory: unavailable right now (the details are in the log)"
        layers = ", ".join(f"{count} {layer}" for layer, count in figures.items.items()) or "none"
        notes = "note" if figures.today_notes == 1 else "notes"
        line = (
            f"Memory: MEMORY.md {_bytes(figures.memory_md_bytes)} · items {layers} · "
            f"{figures.today_notes} {notes} today"
        )
        lines = [
            line,
            _meaning_line(figures.vectors_waiting, figures.vectors_failing),
            _recall_line(figures.last_recall),
        ]
        return "\n".join(part for part in lines if part)

    # -- /compact -----------------------------------------------------------------------------------

    async def compact(self, call: CommandCall, control: SessionControl) -> str:
        keep = _parse_keep(call.args)
        if keep is None:
            return COMPACT_USAGE
        msg = call.message
        async with control.exclusive(call.session_id):
            if await self._sessions.get(call.session_id) is None:
                return "Nothing to compact yet."
            async with self._sessions.lease(msg.channel, msg.chat_id) as session:
                result = await self._budget.compact(session, keep_last=keep, trigger="command")
                if not result.performed:
                    if result.reason.startswith("nothing"):
                        plural = "message" if len(session.messages) == 1 else "messages"
                        return f"Nothing to compact: {len(session.messages)} {plural}, keeping {keep}."
                    return f"Not compacted: {result.reason}."
                # Compacted in memory now: a save the disk refuses is written again until it goes
                # through (the chat told once), as /new's is ("/compact failed" was untrue).
                sessions = self._sessions
                await control.save_through(
                    msg, "compact_save", lambda: sessions.save(session), notice=COMPACT_STORAGE_NOTICE
                )
        removed = f"{result.removed} message{'' if result.removed == 1 else 's'}"
        text = (
            f"Compacted: removed {removed}, kept {result.kept}. "
            f"Tokens {_tokens(result.tokens_before)} → {_tokens(result.tokens_after)}."
        )
        if result.fallback:
            text += f"\nNo summary ({result.reason}): the older messages were saved to memory and dropped."
        return text

    # -- /new ---------------------------------------------------------------------------------------

    async def new(self, call: CommandCall, control: SessionControl) -> str:
        msg = call.message
        async with control.exclusive(call.session_id):
            if await self._sessions.get(call.session_id) is None:
                return "Session cleared."
            async with self._sessions.lease(msg.channel, msg.chat_id) as session:
                if not await self._budget.retire_all(session):
                    return (
                        "I couldn't save this conversation to memory, so I kept it. "
                        "Try /new again in a moment (the details are in the log)."
                    )
                session.usage = Usage()
                session.compactions = 0
                session.metadata.pop(META_LAST, None)
                session.replace_messages([])
                # Cleared in memory now, so a save the disk refuses is written again until it goes
                # through (the chat told once), as a turn's is: "/new failed" was untrue, and the old
                # session came back from disk at the next start.
                sessions = self._sessions
                await control.save_through(
                    msg, "new_save", lambda: sessions.save(session), notice=NEW_STORAGE_NOTICE
                )
        return "Session cleared."


def _parse_keep(args: str) -> int | None:
    text = args.strip()
    if not text:
        return COMPACT_DEFAULT
    try:
        value = int(text)
    except ValueError:
        return None
    low, high = COMPACT_RANGE
    return value if low <= value <= high else None  # "-5" kept 1: a destructive command does as asked


def _usage_line(usage: Usage, *, cost: bool = True) -> str:
    tokens = f"{usage.input_tokens:,} in / {usage.output_tokens:,} out tokens"
    if usage.estimated_calls:  # the endpoint sent no counts for them (bot/llm/estimates.py)
        tokens += f" ({usage.estimated_calls:,} of {usage.calls:,} calls estimated)"
    return f"{tokens} · ${usage.cost_usd:.4f}" if cost else tokens


_PURPOSE_ORDER = ("chat", "compaction", "consolidation", "embedding")


def _purposes_line(purposes: Mapping[str, Usage]) -> str:
    """ "chat 8 calls $0.0100 · compaction 1 call $0.0010": what today's total is made of."""
    names = sorted(purposes, key=lambda n: (_PURPOSE_ORDER.index(n) if n in _PURPOSE_ORDER else 99, n))
    return " · ".join(f"{n} {_calls(purposes[n].calls)} ${purposes[n].cost_usd:.4f}" for n in names)


def _calls(count: int) -> str:
    return f"{count:,} call" if count == 1 else f"{count:,} calls"


def _tokens(value: int) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:.2f}M"
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 1000:
        return f"{value / 1000:.1f}k"
    return str(value)


def _bytes(value: int) -> str:
    return f"{value / 1024:.1f} KB" if value >= 1024 else f"{value} B"


def _duration(seconds: float) -> str:
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {total % 60}s" if minutes else f"{total}s"


def _meaning_line(waiting: int | None, failing: bool) -> str:
    """Whether memory is searched by meaning as well as by words ("" when it is, or has no model for
    it): while the embedding model fails, or new items wait for their vectors, only words find them."""
    if waiting is None:
        return ""
    items = "item" if waiting == 1 else "items"
    if failing:
        return (
            f"Meaning search: paused, the embedding model is not answering ({waiting} {items} waiting); "
            "memory is found by its words meanwhile"
        )
    if waiting >= BACKLOG_SHOWN:
        return f"Meaning search: {waiting} {items} still to index (found by their words until then)"
    return ""


def _recall_line(recall: Mapping[str, object] | None) -> str:
    """What memory gave this chat's last reply, as "Last recall: 3 memories from 40 matches (…) · 1 ms"."""
    if not recall:
        return ""
    pack = recall.get("pack")
    if not isinstance(pack, Mapping):
        return ""
    chosen = pack.get("chosen")
    chosen = chosen if isinstance(chosen, list) else []
    candidates = pack.get("candidates", 0)
    ms = pack.get("ms", 0)
    if not chosen:
        return f"Last recall: nothing relevant among {candidates} items · {ms} ms"
    per_role: dict[str, int] = {}
    for c in chosen:
        if isinstance(c, Mapping):
            role = {"fact": "facts", "assistant": "of its answers"}.get(
                str(c.get("role")), "of your messages"
            )
            per_role[role] = per_role.get(role, 0) + 1
    kinds = ", ".join(f"{n} {role}" for role, n in per_role.items())
    dropped = pack.get("dropped_for_budget", 0)
    over = f", {dropped} left out for the budget" if dropped else ""
    stop = {"floor": "; the rest was not relevant enough", "budget": "; the budget was full"}.get(
        str(pack.get("stop")), ""
    )
    tokens, budget = _int(pack.get("tokens")), _int(pack.get("soft_budget"))
    # The best matches bring the turns around them, which are no candidates: "5 memories of 3" it said.
    matches = f"{candidates} match" if candidates == 1 else f"{candidates} matches"
    around = ", with the turns around them" if _int(pack.get("expanded")) else ""
    return (
        f"Last recall: {len(chosen)} memories from {matches}{around} ({kinds}{over}{stop}) · "
        f"{_tokens(tokens)} / {_tokens(budget)} tokens · {ms} ms"
    )


def _int(value: object) -> int:
    return int(value) if isinstance(value, int | float) else 0
