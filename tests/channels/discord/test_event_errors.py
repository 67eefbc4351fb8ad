"""An exception in a gateway event handler is logged with its traceback and the event's name.

discord.py hands it to ``on_error``, whose log call passed the event's name as ``event=``, the keyword
structlog keeps for the log line's own name: the call raised a TypeError instead, and the original
error surfaced only as "Task exception was never retrieved".
"""

from __future__ import annotations

from typing import Any, cast

import discord
import pytest

from channels.discord import DiscordChannel
from channels.discord.channel import _GatewayClient


async def test_a_failing_event_handler_is_logged_with_the_events_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = _GatewayClient(cast(DiscordChannel, object()), intents=discord.Intents.none())
    try:
        raise RuntimeError("the Discord channel is not started")
    except RuntimeError:
        await client.on_error("on_message")
    logged: list[dict[str, Any]] = [
        r.msg
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg.get("event") == "discord_event_failed"
    ]
    assert [(e["handler"], e["exc_info"]) for e in logged] == [("on_message", True)]  # with the traceback
