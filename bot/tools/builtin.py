"""The built-in tool set, built from the ``tools`` settings slice for the composition root."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import httpx

from bot.config import ToolSettings
from bot.tools.base import Tool
from bot.tools.clock import TimeTool
from bot.tools.files import DEFAULT_PROTECTED, FilesTool, LongTermFile
from bot.tools.shell import ShellTool
from bot.tools.web_fetch import WebFetchTool


def builtin_tools(
    settings: ToolSettings,
    *,
    workspace: Path,
    timezone: str,
    http: httpx.AsyncClient,
    long_term: LongTermFile[Any] | None = None,
    private_memory: bool = False,
    operator_files: Collection[str] = (),
) -> list[Tool]:
    """Every built-in tool; :class:`ToolRegistry` then keeps the enabled ones per channel.

    ``http`` is the web_fetch client (``trust_env=False``); ``long_term`` comes from the memory
    service, without it ``files`` cannot write MEMORY.md (the memory tool, bot/memory/tool.py, is
    added by the app).
    ``private_memory`` (``memory.scope = "chat"``) closes ``memory/`` to ``files`` altogether, since it
    holds every chat's notes and the model must see only its own chat's, through the prompt.
    ``operator_files``: the configuration files kept in the workspace, relative to it
    (:func:`~bot.tools.confine.inside_workspace`), closed to ``files`` and ``shell`` as the bot's state is.
    """
    protected = (*DEFAULT_PROTECTED, *(("memory",) if private_memory else ()), *operator_files)
    tools: list[Tool] = [
        FilesTool(
            workspace,
            max_bytes=settings.max_file_read_bytes,
            long_term=long_term,
            protected=protected,
            # A page plus its wrapper and note stays under the loop's cut, so no view is ever cut.
            page_chars=settings.result_max_chars - 1000,
        ),
        WebFetchTool(
            http,
            max_bytes=settings.web_max_bytes,
            timeout=settings.web_timeout,
            max_redirects=settings.web_max_redirects,
        ),
        TimeTool(timezone),
        ShellTool(
            workspace,
            allow=settings.shell_allow,
            timeout=settings.shell_timeout,
            max_memory=settings.shell_max_memory_bytes,
            max_output=settings.result_max_chars * 4,
            protected=protected,  # the same rules as files: memory/ vanishes too in chat scope
        ),
    ]
    return tools
