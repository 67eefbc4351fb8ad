"""The time tool answers in the configured zone, or in one the model asks for."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bot.tools import ToolContext, ToolError
from bot.tools.clock import TimeTool

CTX = ToolContext("test:chat", "test", "turn1")
NOW = datetime(2026, 3, 1, 23, 30, tzinfo=UTC)  # already Monday in Berlin


async def test_configured_zone() -> None:
    text = await TimeTool("Europe/Berlin", now=lambda: NOW).run({}, CTX)
    assert text.startswith("Monday, 02 March 2026, 00:30:00 in Europe/Berlin (UTC+01:00)")
    assert "ISO: 2026-03-02T00:30:00+01:00; ISO week 10 of 2026" in text


async def test_asked_zone_and_errors() -> None:
    tool = TimeTool("UTC", now=lambda: NOW)
    assert "Monday, 02 March 2026, 08:30:00 in Asia/Tokyo (UTC+09:00)" in await tool.run(
        {"timezone": "Asia/Tokyo"}, CTX
    )
    with pytest.raises(ToolError, match="unknown time zone 'Mars/Base'"):
        await tool.run({"timezone": "Mars/Base"}, CTX)
    with pytest.raises(ToolError, match="unknown time zone"):
        await tool.run({"timezone": "../../etc/passwd"}, CTX)
