"""What the Telegram channel reports of its health, as /healthz serves it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiohttp import web

from bot.admin import health_report
from tests.channels.telegram.kit import running_channel
from tests.fakes.telegram_server import FakeTelegramServer


class EchoingFront(FakeTelegramServer):
    """A Bot API front (a proxy, a self-hosted server) whose error page repeats the request path."""

    broken = False

    async def _api(self, request: web.Request) -> web.Response:
        if self.broken and request.match_info["method"] == "getUpdates":
            page = (
                f"<html><body><h1>502 Bad Gateway</h1>upstream failed for POST {request.path}</body></html>"
            )
            return web.Response(status=502, text=page, content_type="text/html")
        return await super()._api(request)


async def test_a_polling_error_that_quotes_the_token_is_served_without_it(tmp_path: Path) -> None:
    async with EchoingFront() as tg, running_channel(tg, tmp_path) as (channel, _sink):
        tg.broken = True
        async with asyncio.timeout(30):
            while channel.health.error is None:
                await asyncio.sleep(0.05)
        _, body = health_report({"telegram": channel.health}, None, uptime=1.0)

    error = body["channels"]["telegram"]["error"]
    assert "Bad Gateway" in error and tg.token.split(":")[1] not in json.dumps(body)
