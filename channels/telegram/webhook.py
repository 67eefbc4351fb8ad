"""The Telegram webhook endpoint: an aiohttp server that acknowledges an update only once it is stored.

PTB's own webhook server (tornado) answers Telegram before the update is processed, so a crash right
after would lose the message. Here the handler awaits the channel's ``accept`` (which returns once the
update is in the channel's journal on disk, see :mod:`channels.telegram.journal`) and only then answers
200. When it could not be stored (a full disk, or the journal is full) the answer is 503, and on any
other failure 500: Telegram then delivers the update again. Every request must carry the secret token
set with setWebhook (:func:`register_webhook`, called once the server listens).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import structlog
from aiohttp import web

from channels.outage import is_storage_error
from channels.telegram.polling import ALLOWED_UPDATES

if TYPE_CHECKING:
    from telegram import Bot

    from bot.config import TelegramSettings
    from channels.telegram.outbound import TelegramOutbox

log = structlog.get_logger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"

UpdateHandler = Callable[[dict[str, Any]], Awaitable[None]]


def webhook_server(settings: TelegramSettings, handle: UpdateHandler) -> WebhookServer:
    """The server for ``telegram.webhook_url`` on ``webhook_listen:webhook_port``, not yet started."""
    assert settings.webhook_url is not None and settings.webhook_secret is not None
    return WebhookServer(
        host=settings.webhook_listen,
        port=settings.webhook_port,
        public_url=settings.webhook_url,
        secret=settings.webhook_secret.get_secret_value(),
        handle=handle,
    )


async def register_webhook(settings: TelegramSettings, bot: Bot, outbox: TelegramOutbox) -> None:
    """Point Telegram at ``telegram.webhook_url`` with the secret (setWebhook, through ``outbox``'s
    retries); call it once the server listens, so no update is sent to a closed port."""
    await outbox.call(
        lambda: bot.set_webhook(
            url=settings.webhook_url or "",
            secret_token=settings.webhook_secret.get_secret_value() if settings.webhook_secret else None,
            allowed_updates=ALLOWED_UPDATES,
        ),
        what="setWebhook",
    )


class WebhookServer:
    """Serves ``POST <path of public_url>`` on ``host:port`` inside the bot's event loop."""

    def __init__(self, *, host: str, port: int, public_url: str, secret: str, handle: UpdateHandler) -> None:
        self._host = host
        self._port = port
        self._path = urlsplit(public_url).path or "/"
        self._secret = secret.encode()
        self._handle = handle
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post(self._path, self._on_post)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, self._port).start()
        log.info("telegram_webhook_listening", host=self._host, port=self.port, path=self._path)

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0)."""
        if self._runner is None or not self._runner.addresses:
            return self._port
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _on_post(self, request: web.Request) -> web.Response:
        given = request.headers.get(SECRET_HEADER, "").encode()
        if not hmac.compare_digest(given, self._secret):
            log.warning("telegram_webhook_bad_secret", remote=request.remote)
            return web.Response(status=403, text="forbidden")
        try:
            update = json.loads(await request.read())
        except ValueError:
            return web.Response(status=400, text="invalid JSON")
        if not isinstance(update, dict) or not isinstance(update.get("update_id"), int):
            return web.Response(status=400, text="invalid update")
        try:
            await self._handle(update)
        except Exception as exc:
            if is_storage_error(exc):  # logged once per outage where it happened
                return web.Response(status=503, text="not stored; deliver again")
            log.exception("telegram_webhook_update_failed", update_id=update.get("update_id"))
            return web.Response(status=500, text="not stored; deliver again")
        return web.Response(status=200)
