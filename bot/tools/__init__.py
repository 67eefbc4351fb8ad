"""Tools the model may call, the registry that offers them per channel, and the built-in set."""

from bot.tools.base import Tool, ToolContext, ToolError, ToolRegistry, check_tool_names, untrusted
from bot.tools.builtin import builtin_tools
from bot.tools.confine import bot_writes, inside_workspace
from bot.tools.journal import CallKey, ToolJournal
from bot.tools.web_fetch import web_client

__all__ = [
    "CallKey",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolJournal",
    "ToolRegistry",
    "bot_writes",
    "builtin_tools",
    "check_tool_names",
    "inside_workspace",
    "untrusted",
    "web_client",
]
