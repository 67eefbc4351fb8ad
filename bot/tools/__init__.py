"""Tools the model may call, the registry that offers them per channel, and the built-in set."""

from bot.tools.base import Tool, ToolContext, ToolError, ToolRegistry, check_tool_names, untrusted
from bot.tools.builtin import builtin_tools

__all__ = [
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "builtin_tools",
    "check_tool_names",
    "untrusted",
]
