"""Start-up checks and repairs: fail fast on what cannot work, mend what the previous run left behind.

The composition root (bot/app.py) runs them before and while it builds: a model provider must be
reachable (:func:`check_llm_configured`, also run by ``membot doctor``); the workspace is owned by this
process, created private, tightened and cleared of stale temp files (:func:`own_workspace`); memory
gets back what a stop before its fsync may have lost (:func:`recover_memory`). A check that fails
raises a :class:`~bot.errors.ConfigError` naming the setting to fix.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import TYPE_CHECKING

import structlog

from bot import model_choice
from bot.errors import ConfigError, StorageError
from bot.storage import ensure_private_dir, fix_private_tree, remove_stale_temp_files
from bot.tools import bot_writes
from bot.workspace_lock import WorkspaceLock, unusable

if TYPE_CHECKING:
    from bot.catalog import ModelCatalog
    from bot.config import Settings
    from bot.memory import MemoryService
    from bot.session_service import SessionService

log = structlog.get_logger(__name__)

RECOVERY_SLACK = timedelta(minutes=1)


def check_llm_configured(settings: Settings, catalog: ModelCatalog) -> None:
    """Fail at once, with the settings to set, when no model provider can be reached."""
    llm = settings.llm
    provider = model_choice.provider(llm, catalog)
    if provider == "anthropic" and llm.anthropic.api_key is None:
        raise ConfigError(
            f"model {llm.model!r} is an Anthropic model but no Anthropic API key is set: "
            "set MEMBOT_LLM__ANTHROPIC__API_KEY (or [llm.anthropic] api_key in the config file)."
        )
    if provider == "openai" and llm.openai.api_key is None and llm.openai.base_url is None:
        if llm.anthropic.api_key is not None:
            raise ConfigError(
                f"an Anthropic API key is set, but the model is {llm.model!r}, which OpenAI serves, and "
                "no OpenAI key is set: set MEMBOT_LLM__MODEL to a Claude model, e.g. claude-sonnet-4-5 "
                "(`membot models` lists them), or set MEMBOT_LLM__OPENAI__API_KEY."
            )
        raise ConfigError(
            "no LLM is configured. Set one of:\n"
            # (a key's place written "<your key: sk-...>": "=sk-..." was masked as a secret, "=***")
            "  OpenAI:     MEMBOT_LLM__OPENAI__API_KEY=<your key: sk-...>  (model: MEMBOT_LLM__MODEL)\n"
            "  Anthropic:  MEMBOT_LLM__MODEL=claude-sonnet-4-5\n"
            "              MEMBOT_LLM__ANTHROPIC__API_KEY=<your key: sk-ant-...>\n"
            "  Local:      MEMBOT_LLM__OPENAI__BASE_URL=http://localhost:11434/v1\n"
            "              MEMBOT_LLM__MODEL=llama3.1\n"
            "              (Ollama, vLLM, llama.cpp, LM Studio: any OpenAI-compatible server)\n"
            "The same settings can go in a .env file or the TOML config (deploy/membot.example.toml)."
        )


async def own_workspace(settings: Settings, stack: contextlib.AsyncExitStack) -> None:
    """This process owns the workspace (bot/workspace_lock.py) until the stack closes."""
    lock = await asyncio.to_thread(_lock_workspace, settings)
    stack.push_async_callback(asyncio.to_thread, lock.release)
    await asyncio.to_thread(prepare_workspace, settings)


def prepare_workspace(settings: Settings) -> None:
    """Create the workspace (0700) and tighten any file that is more open than it should be; the bot's
    own state gets its owner's write permission back (``bot.tools.confine.bot_writes``)."""
    try:
        ensure_private_dir(settings.workspace)
        for sub in (settings.sessions_dir, settings.memory_dir, settings.workspace / "inbox"):
            ensure_private_dir(sub)
        fixed = fix_private_tree(settings.workspace, bot_writes=bot_writes)
        stale = remove_stale_temp_files(settings.workspace)
    except OSError as exc:
        raise unusable(settings.workspace, exc) from None
    if fixed:
        log.warning("workspace_permissions_fixed", count=fixed, workspace=str(settings.workspace))
    if stale:
        log.info("stale_temp_files_removed", count=stale, workspace=str(settings.workspace))


def _lock_workspace(settings: Settings) -> WorkspaceLock:
    try:
        return WorkspaceLock.acquire(settings.workspace)
    except OSError as exc:
        raise unusable(settings.workspace, exc) from None


async def recover_memory(memory: MemoryService, sessions: SessionService) -> None:
    """The last run stopped before its memory writes were fsynced (bot/memory/lazy_sync.py): record
    again what the sessions changed since then hold and memory lacks (a power cut may have lost it).

    A write the disk refuses (a full disk) does not stop the start: memory's records can wait, the
    chats' messages cannot, and a start that ended here was restarted by systemd into the same failure
    until it gave up, with every acknowledged message unanswered. The marker then stays (only
    ``recovered`` removes it), so the next start records what is still missing, none of it twice."""
    assert memory.unsynced_since is not None
    since = memory.unsynced_since - RECOVERY_SLACK  # a turn's session save may precede the marker
    recorded = 0
    try:
        changed = await sessions.changed_since(since)
        for sid in changed:
            session = await sessions.get(sid)
            if session is not None:
                recorded += await memory.recover(session)
    except (OSError, StorageError) as exc:
        log.error(
            "memory_recovery_failed",
            error=exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc),
            path=getattr(exc, "filename", None),
            messages=recorded,
            hint="free disk space or fix the workspace's permissions; the bot answers meanwhile, and the "
            "next start records again what memory lacks (memory/.unsynced stays until then)",
        )
        return
    await memory.recovered()
    log.warning("memory_recovered", since=since.isoformat(), sessions=len(changed), messages=recorded)
