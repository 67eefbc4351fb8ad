"""Chat platform adapters: each turns its platform's updates into ``InboundMessage``s and sends replies.

The terminal adapter is exported here; Telegram and Discord are packages of their own
(``channels.telegram``, ``channels.discord``), imported only when configured: their libraries are large.
"""

from channels.base import Channel
from channels.terminal import TerminalChannel
from channels.terminal_io import line_editor, stdin_reader

__all__ = ["Channel", "TerminalChannel", "line_editor", "stdin_reader"]
