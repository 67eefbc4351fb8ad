"""Built-in tools and the registry."""

from bot.tools.base import Tool, ToolContext, ToolError, ToolRegistry, untrusted

__all__ = ["Tool", "ToolContext", "ToolError", "ToolRegistry", "untrusted"]
