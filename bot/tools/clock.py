"""The ``time`` tool: today's date and the time in the configured zone, so "today" and "next Monday" work."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bot.domain import utcnow
from bot.tools.base import ToolContext, ToolError

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "timezone": {
            "type": "string",
            "description": "Optional IANA time zone such as 'Asia/Tokyo'; default: the user's zone.",
        }
    },
}


class TimeTool:
    """Current date and time. ``timezone`` is the operator's ``settings.timezone``; ``now`` is injectable."""

    name = "time"
    description = "Get the current date, weekday and time (in the user's time zone unless another is given)."
    parameters = _SCHEMA

    def __init__(self, timezone: str, *, now: Callable[[], datetime] = utcnow) -> None:
        self._default = timezone
        self._now = now

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        asked = args.get("timezone") or self._default
        if not isinstance(asked, str):
            raise ToolError("timezone must be a string such as 'Europe/Berlin'")
        try:
            zone = await asyncio.to_thread(ZoneInfo, asked)  # the first load of a zone reads tzdata
        except (ZoneInfoNotFoundError, ValueError):
            raise ToolError(f"unknown time zone {asked!r}; use an IANA name like 'Europe/Berlin'") from None
        local = self._now().astimezone(zone)
        offset = local.strftime("%z")
        week = local.isocalendar()
        return (
            f"{local:%A, %d %B %Y, %H:%M:%S} in {zone.key} (UTC{offset[:3]}:{offset[3:]})\n"
            f"ISO: {local.isoformat(timespec='seconds')}; ISO week {week.week} of {week.year}"
        )
