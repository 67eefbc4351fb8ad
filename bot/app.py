"""The composition root: the one place that builds membot's parts and connects them.

Settings are loaded by the CLI and passed in; everything else is constructed here, in dependency order,
and handed to its users. Long-lived resources (the workspace lock, the HTTP clients, memory, the
dispatcher, the channels and the ops HTTP server) enter the one AsyncExitStack of :func:`build_core`, so
each is closed once, in reverse order, whatever happens; channels and the ops server go into its
``core.edge`` part, which closes after the dispatcher has drained. Channel libraries, aiohttp and
prometheus_client for the ops endpoints, and memory's read path (numpy, simplemma) are imported only
when configured, so start-up time and memory follow the configuration. This is the only module of
``bot`` that imports ``channels``: the CLI's long-running commands take their channels from here
(``membot run``: bot/serve.py; ``membot chat``: bot/terminal_chat.py), and the checks and repairs of
start-up are in bot/startup.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

import httpx
import structlog

from bot import channel_choice, model_choice
from bot.catalog import ModelCatalog, load_catalog
from bot.commands import CommandRouter, SessionCommands
from bot.compaction import CompactionService, MemoryRetirer
from bot.config import DEFAULT_CONFIG_FILE, Settings
from bot.context_budget import ContextBudget, prompt_room
from bot.dispatcher import Dispatcher
from bot.domain import utcnow
from bot.errors import ConfigError
from bot.inbox import Inbox
from bot.llm import ChatModel, LLMClient, llm_http_client
from bot.memory import CONSOLIDATION_OUTPUT, MemoryService, MemoryTool
from bot.memory import operator as memory_operator
from bot.model_wait import WAIT_FILE, WaitRecords
from bot.session_moves import carry_moves
from bot.session_service import SessionService
from bot.sessions import JsonSessionStore
from bot.startup import check_llm_configured, own_workspace, recover_memory
from bot.tokens import TokenCounter
from bot.tools import (
    ToolJournal,
    ToolRegistry,
    builtin_tools,
    check_tool_names,
    inside_workspace,
    web_client,
)
from bot.usage import UsageLedger
from channels import Channel
from pipeline import (
    AutoCompactionSystem,
    ContextBuildingSystem,
    MemoryPersistSystem,
    Pipeline,
    System,
    ToolLoopSystem,
    UsageSystem,
)

if TYPE_CHECKING:
    from bot.memory import Embedder
    from bot.metrics import Metrics
    from bot.pairing import PairingStore
    from channels import TerminalChannel

log = structlog.get_logger(__name__)


@dataclass
class Core:
    """Everything a running membot has, built once by :func:`build_core`.

    ``edge`` is the part of the exit stack for what faces the outside (the ops HTTP server and the
    channels): what enters it is closed after the dispatcher has drained and memory has flushed, so
    the replies of finishing turns can still go out.
    """

    settings: Settings
    catalog: ModelCatalog
    sessions: SessionService
    inbox: Inbox
    commands: CommandRouter
    dispatcher: Dispatcher
    llm: ChatModel
    memory: MemoryService
    edge: contextlib.AsyncExitStack


@contextlib.asynccontextmanager
async def build_core(
    settings: Settings,
    *,
    http: httpx.AsyncClient | None = None,
    llm: ChatModel | None = None,
    embedder: Embedder | None = None,
    metrics: Metrics | None = None,
    clock: Callable[[], datetime] = utcnow,
) -> AsyncIterator[Core]:
    """Build and connect membot's parts; close them in reverse order on exit.

    ``http``, ``llm`` and ``embedder`` replace the HTTP client, the model client and the embedding model
    (benchmarks, embedding apps); ``metrics`` (``membot run``) observes turns, tool calls, compactions
    and consolidations; ``clock`` is the machine's as the dispatcher reads it to date messages (tests
    step it back).

    On exit the one exit stack closes, in this order: the dispatcher (running turns get
    ``lifecycle.grace_period``), memory (pending writes), ``core.edge`` (channels in reverse start
    order, then the ops server), the usage ledger, the HTTP clients and the workspace lock.
    """
    catalog = await asyncio.to_thread(load_catalog, settings.models_file)
    check_llm_configured(settings, catalog)
    async with contextlib.AsyncExitStack() as stack:
        await own_workspace(settings, stack)  # first of all, and released last
        http, web_http = await _http_clients(settings, stack, http)
        # Before anything that may call the model: the client reports every call (chat, compaction,
        # consolidation) to the ledger, and the flush is pushed first so it runs after memory.close.
        ledger = UsageLedger(settings.workspace / "usage.json", tz=ZoneInfo(settings.timezone))
        stack.push_async_callback(ledger.close)
        # One counter for the budget and for the calls a server sends no usage for (bot/llm/estimates.py).
        counter = await _token_counter(settings, catalog)
        model = (
            llm if llm is not None else LLMClient(settings.llm, catalog, http, usage=ledger, counter=counter)
        )
        edge = await stack.enter_async_context(contextlib.AsyncExitStack())  # after the drain, see Core
        window = model_choice.window(settings.llm, catalog)
        memory = await _memory(settings, model, counter, embedder, http, metrics, window)
        stack.push_async_callback(memory.close)  # runs after dispatcher.close, pushed below
        # Tokens and allowlists: no tool reads or edits them, wherever in the workspace they are kept.
        # The default TOML file too while it does not exist: the next start would read what a tool put
        # there (a workspace at ~/.membot holds its place).
        config = (settings.config_file, DEFAULT_CONFIG_FILE, settings.models_file, settings.env_file)
        operator_files = await asyncio.to_thread(inside_workspace, settings.workspace, config)
        registry = _tools(settings, memory, web_http, operator_files)
        budget = _context_budget(settings, catalog, model, counter, memory, registry, metrics, window)
        # The client reports every model call to the ledger; an injected model does not.
        pipeline = _pipeline(
            settings, model, memory, registry, budget, None if llm is None else ledger, metrics
        )
        store = JsonSessionStore(settings.sessions_dir)
        inbox_dir = settings.workspace / "inbox"
        await carry_moves(settings.state_dir, store, memory, inbox_dir=inbox_dir)  # (before any is loaded)
        await memory.resume()  # the consolidations a kill cut short, of the chats as they are now
        sessions = SessionService(store, cache_size=settings.sessions.cache_size)
        if memory.unsynced_since is not None:
            await recover_memory(memory, sessions)
        commands = _commands(settings, catalog, sessions, budget, ledger, memory)
        inbox = Inbox(inbox_dir)
        dispatcher = Dispatcher(
            pipeline,
            sessions,
            commands,
            settings.dispatcher,
            inbox=inbox,
            max_inbound_chars=settings.sessions.max_inbound_chars,
            observer=metrics,
            waits=WaitRecords(settings.state_dir / WAIT_FILE),
            redelivery_window=channel_choice.redelivery_window(settings),
            clock=clock,
        )
        stack.push_async_callback(dispatcher.close, settings.lifecycle.grace_period)
        yield Core(settings, catalog, sessions, inbox, commands, dispatcher, model, memory, edge)


# ---- the steps of build_core, in its order ----------------------------------------------------------


async def _http_clients(
    settings: Settings, stack: contextlib.AsyncExitStack, http: httpx.AsyncClient | None
) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
    """The model's client (unless one was given) and web_fetch's own."""
    if http is None:
        timeout = httpx.Timeout(settings.llm.timeout, connect=settings.llm.connect_timeout)
        # Built in a thread: its first use imports aiohttp (file reads the loop must not wait for).
        http = await stack.enter_async_context(await asyncio.to_thread(llm_http_client, timeout))
    web_http = await stack.enter_async_context(web_client(settings.tools.web_timeout))
    return http, web_http


async def _token_counter(settings: Settings, catalog: ModelCatalog) -> TokenCounter:
    return await asyncio.to_thread(
        TokenCounter.offline,
        model=settings.llm.model,
        provider=model_choice.provider(settings.llm, catalog),
    )


async def _memory(
    settings: Settings,
    model: ChatModel,
    counter: TokenCounter,
    embedder: Embedder | None,
    http: httpx.AsyncClient,
    metrics: Metrics | None,
    window: int,
) -> MemoryService:
    """Always built and started (archive and raw fallbacks keep working); the LLM only when enabled."""
    enabled = settings.memory.enabled
    if enabled and embedder is None:
        from bot.memory import build_embedder  # loads numpy: see the module doc

        embedder = build_embedder(settings.memory, http)
    memory = MemoryService(
        settings.memory_dir,
        settings.memory,
        timezone=settings.timezone,
        llm=model if enabled else None,
        consolidation_model=settings.memory.consolidation_model,
        count_tokens=counter,
        embedder=embedder if enabled else None,
        maintain_every=timedelta(days=1),  # promotion, decay and log compaction
        observer=metrics,
        consolidation_room=prompt_room(window, CONSOLIDATION_OUTPUT),
        retrieval=enabled,
    )
    await memory.start(resume=False)  # resumed once the moved chats took their records (build_core)
    return memory


def _tools(
    settings: Settings, memory: MemoryService, web_http: httpx.AsyncClient, operator_files: list[str]
) -> ToolRegistry:
    tools = builtin_tools(
        settings.tools,
        workspace=settings.workspace,
        timezone=settings.timezone,
        http=web_http,
        # In chat scope the workspace MEMORY.md is the operator's: the files tool may not write it.
        long_term=None if memory.chat_scope else memory.longterm,
        private_memory=memory.chat_scope,
        operator_files=operator_files,
    )
    check_tool_names(settings.tools, {t.name for t in tools} | {MemoryTool.name})
    if settings.memory.enabled:
        tools.append(MemoryTool(memory))
    return ToolRegistry(tools, settings.tools)


def _context_budget(
    settings: Settings,
    catalog: ModelCatalog,
    model: ChatModel,
    counter: TokenCounter,
    memory: MemoryService,
    registry: ToolRegistry,
    metrics: Metrics | None,
    window: int,
) -> ContextBudget:
    """The budget, and the compaction it runs when a session outgrows the model's ``window``."""
    info = model_choice.primary(settings.llm, catalog)
    summary_model = model_choice.summary_model(settings.llm, catalog)
    retirer = MemoryRetirer(memory, timeout=settings.memory.consolidation_timeout)
    compaction = CompactionService(
        model,
        counter,
        retirer,
        settings.compaction,
        summary_model=summary_model,
        max_prompt_tokens=prompt_room(
            min(window, catalog.get(summary_model).max_input_tokens), settings.compaction.summary_max_tokens
        ),
        observer=metrics,
    )
    return ContextBudget(
        counter,
        compaction,
        retirer,
        settings.compaction,
        window=window,
        max_output_tokens=min(settings.llm.max_output_tokens, info.max_output_tokens),
        base_prompt=settings.system_prompt,
        tools=registry.specs(""),
        memory_cap=memory.default_budget() if settings.memory.enabled else 0,
    )


def _pipeline(
    settings: Settings,
    model: ChatModel,
    memory: MemoryService,
    registry: ToolRegistry,
    budget: ContextBudget,
    ledger: UsageLedger | None,
    metrics: Metrics | None,
) -> Pipeline:
    """The systems of a turn; ``Pipeline`` sorts them by order (in the comments)."""
    enabled = settings.memory.enabled
    systems: list[System] = [
        AutoCompactionSystem(budget),  # 18
        ContextBuildingSystem(memory if enabled else None, settings.system_prompt, budget=budget),  # 20
        ToolLoopSystem(  # 30
            model,
            registry,
            settings.tools,
            budget=budget,
            max_overflow_retries=settings.compaction.max_overflow_retries,
            observer=metrics,
            journal=ToolJournal.of(settings.state_dir),
        ),
        UsageSystem(budget, ledger),  # 90
    ]
    if enabled:
        systems.append(MemoryPersistSystem(memory, settings.memory))  # 50
    return Pipeline(systems)


def _commands(
    settings: Settings,
    catalog: ModelCatalog,
    sessions: SessionService,
    budget: ContextBudget,
    ledger: UsageLedger,
    memory: MemoryService,
) -> CommandRouter:
    """The router (/help, /stop) with the session commands (/status, /compact, /new), and the terminal's
    own /quit for its /help."""
    session_commands = SessionCommands(
        sessions,
        budget,
        model=model_choice.primary(settings.llm, catalog),
        tier=catalog.tier_of(settings.llm.model),
        ledger=ledger,
        admins=channel_choice.admins(settings),
        memory_stats_for=(
            (lambda sid: memory_operator.stats(memory, session_id=sid)) if settings.memory.enabled else None
        ),
    )
    commands = CommandRouter()
    commands.add("status", "Model, context, usage and memory of this chat", session_commands.status)
    commands.add(
        "compact", "Summarize older messages now: /compact [N] keeps the last N", session_commands.compact
    )
    commands.add("new", "Save this conversation to memory and start a fresh one", session_commands.new)
    commands.add_own("cli", "quit", "End the chat (/exit too)")  # channels/terminal.py ends it itself
    return commands


# ---- the channels -----------------------------------------------------------------------------------


def _pairing(core: Core) -> PairingStore:
    from bot.pairing import PAIRING_FILE, PairingStore

    return PairingStore(core.settings.workspace / PAIRING_FILE)


async def start_channel(name: str, core: Core) -> Channel:
    """Build the channel ``name``, start it and hand its teardown to ``core.edge``."""
    channel: Channel
    if name == "cli":
        channel = await terminal_channel(core)
    elif name == "telegram":
        from channels.telegram import TelegramChannel

        channel = TelegramChannel(
            core.settings.telegram,
            core.dispatcher.submit,
            pairing=_pairing(core),
            state_dir=core.settings.state_dir,
            commands=core.commands.commands,
            vision_supported=lambda: core.catalog.get(core.settings.llm.model).supports_vision,
            max_inbound_chars=core.settings.sessions.max_inbound_chars,
        )
    elif name == "discord":
        from channels.discord import DiscordChannel

        channel = DiscordChannel(
            core.settings.discord,
            core.dispatcher.submit,
            pairing=_pairing(core),
            commands=core.commands.commands,
            vision_supported=lambda: core.catalog.get(core.settings.llm.model).supports_vision,
            state_dir=core.settings.state_dir,
        )
    else:
        raise ConfigError(f"channel {name!r} is not available in this build")
    await open_channel(channel, core)
    return channel


async def terminal_channel(core: Core) -> TerminalChannel:
    """The terminal channel over this process's stdin and stdout, not started (see :func:`open_channel`)."""
    from channels import TerminalChannel, line_editor, stdin_reader

    user = core.settings.terminal.user
    if sys.stdin.isatty() and sys.stdout.isatty():
        # A person at a terminal: a line editor (prompt_toolkit, imported only then) with the user's
        # history of sent messages, private like the sessions (channels/terminal_prompt.py).
        from bot.session_names import encode_id

        history = core.settings.state_dir / "terminal_history" / f"{encode_id(user)}.jsonl"
        editor = await line_editor("you › ", history)
        return TerminalChannel(core.dispatcher.submit, user=user, writer=editor, editor=editor)
    return TerminalChannel(
        core.dispatcher.submit,
        user=user,
        reader=await stdin_reader(),
        writer=sys.stdout,
        # A person pastes at a terminal; piped or file input is one message per line, as scripts expect.
        join_pastes=sys.stdin.isatty(),
    )


async def open_channel(channel: Channel, core: Core) -> None:
    """Attach ``channel`` to the dispatcher, start it, and let ``core.edge`` stop it."""
    core.dispatcher.attach(channel, ready=False)
    await channel.start()
    core.edge.push_async_callback(_stop, channel)
    core.dispatcher.ready(channel.name)  # its chats' recovered and new messages are answered from now on


async def _stop(channel: Channel) -> None:
    # One failing stop does not keep the other channels running.
    try:
        await channel.stop()
    except Exception:
        log.exception("channel_stop_failed", channel=channel.name)
