"""The ops HTTP server: ``GET /healthz`` and ``GET /metrics``, served inside the bot's own event loop.

It runs on aiohttp's ``AppRunner`` + ``TCPSite`` (not ``web.run_app``, which would want the loop to
itself), bound to ``admin.host`` — 127.0.0.1 by default, because metrics name models and channels and
nothing here is authenticated. Put a reverse proxy in front if it must be reached from elsewhere.

``/healthz`` answers **200 only when every channel is ``running``** and storage takes every write.
Any channel that is ``degraded``, ``failed``, ``starting`` or ``stopped`` makes it **503**: the process is
not fully doing its job, and an orchestrator or an operator should look. So does a write that storage
refuses (a full disk, a read-only workspace), listed under ``storage``: a channel that cannot store
what it takes in (it takes nothing in meanwhile), or each chat held at its save or done mark; it clears
by itself once the write goes through, as a platform out of reach does, or once nothing waits for it
any more (the message given up after failing for another reason: logged as such; the next write that
storage refuses names it again). The LLM's reachability (from
the last real call; no probe is made, so a health check costs nothing) is reported in the body but does
not change the status code: restarting membot cannot fix a provider outage, and a restart loop would
only drop running turns. Nor do ``kept_answers`` (answers a platform refused, kept in the inbox per
chat: a user blocked the bot, a channel is gone; ``reply_refused`` in the log says why): an operator
acts on them, a restart does not.

    async with AdminServer(settings.admin, metrics, channels=runner.channel_health, llm_stats=stats):
        ...  # serving until the block ends
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import structlog
from aiohttp import web

from bot.config import AdminSettings
from bot.errors import ConfigError, InUseError
from bot.llm import LLMStats
from bot.logging import redact_shapes
from bot.metrics import CONTENT_TYPE, Metrics
from bot.ports import ChannelHealth

log = structlog.get_logger(__name__)

ChannelsSource = Callable[[], Mapping[str, ChannelHealth]]
StatsSource = Callable[[], LLMStats | None]
KeptSource = Callable[[], Mapping[str, int]]  # session id -> answers kept aside, undelivered
StorageSource = Callable[[], Mapping[str, str]]  # writes held up by storage ("what (chat)" -> error)


def health_report(
    channels: Mapping[str, ChannelHealth],
    llm: LLMStats | None,
    *,
    uptime: float,
    kept: Mapping[str, int] | None = None,
    storage: Mapping[str, str] | None = None,
    redact: Callable[[str], str] = redact_shapes,
) -> tuple[int, dict[str, Any]]:
    """The /healthz status code and body (see the module doc for when it is 503). ``storage``: the
    writes the core waits to make (the dispatcher's), one per chat held (``"session_save
    (telegram:42)"``); the channels' own are in their health. Error
    texts pass through ``redact`` (the log's: the configured secrets and credential shapes): a Bot API
    front that echoes the request path in its error page puts the bot token in a channel's error."""
    failing = {
        f"{name}: {what}": error for name, h in channels.items() for what, error in h.storage_errors.items()
    }
    failing.update(storage or {})
    healthy = bool(channels) and all(h.state == "running" for h in channels.values()) and not failing
    body: dict[str, Any] = {
        "status": "ok" if healthy else "unhealthy",
        "uptime_seconds": round(uptime, 1),
        "channels": {
            name: {
                "state": h.state,
                "last_inbound": h.last_inbound.isoformat() if h.last_inbound else None,
                "error": redact(h.error) if h.error else None,
                "sent": h.sent,
                "send_failures": h.send_failures,
            }
            for name, h in channels.items()
        },
        "llm": _llm_report(llm, redact),
        "kept_answers": {"total": sum((kept or {}).values()), "chats": dict(sorted((kept or {}).items()))},
        "storage": {
            "ok": not failing,
            "failing": {what: redact(error) for what, error in sorted(failing.items())},
        },
    }
    return (200 if healthy else 503), body


def _llm_report(stats: LLMStats | None, redact: Callable[[str], str]) -> dict[str, Any]:
    if stats is None:
        return {"reachable": None}
    return {
        "reachable": stats.last_ok,  # None: no call made yet
        "last_call_at": stats.last_call_at.isoformat() if stats.last_call_at else None,
        "last_error": redact(stats.last_error) if stats.last_error else None,  # a key in a URL
        "calls": stats.calls,
        "failures": stats.failures,
        # models failing with an outage, asked after the others for now (bot/llm/breaker.py)
        "skipped_models": {model: since.isoformat() for model, since in stats.skipped.items()},
    }


class AdminServer:
    """/healthz and /metrics on ``host:port``; an async context manager that starts and stops the site.

    ``port=0`` binds a free port (tests); :attr:`port` tells which one.
    """

    def __init__(
        self,
        settings: AdminSettings,
        metrics: Metrics,
        *,
        channels: ChannelsSource,
        llm_stats: StatsSource,
        kept_answers: KeptSource = dict,
        storage: StorageSource = dict,
        clock: Callable[[], float] = time.monotonic,
        redact: Callable[[str], str] = redact_shapes,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._channels = channels
        self._llm_stats = llm_stats
        self._kept_answers = kept_answers
        self._storage = storage
        self._clock = clock
        self._redact = redact  # the log's redaction: what /healthz shows of errors passes through it
        self._started = clock()
        self._runner: web.AppRunner | None = None
        self.port: int = settings.port

    async def __aenter__(self) -> AdminServer:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics_page)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._settings.host, self._settings.port)
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            # A port in use may be free in a moment (the old membot still stopping): worth a restart. A
            # host that is no address of this machine, or a port below 1024, never will be.
            error = InUseError if exc.errno == errno.EADDRINUSE else ConfigError
            raise error(
                f"cannot serve the admin endpoint on {self._settings.host}:{self._settings.port}: "
                f"{exc.strerror or exc} (set MEMBOT_ADMIN__PORT, or MEMBOT_ADMIN__ENABLED=false)"
            ) from None
        self._runner = runner
        addresses = runner.addresses
        if addresses:
            self.port = int(addresses[0][1])
        log.info("admin_listening", host=self._settings.host, port=self.port)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, request: web.Request) -> web.Response:
        status, body = health_report(
            self._channels(),
            self._llm_stats(),
            uptime=self._clock() - self._started,
            kept=self._kept_answers(),
            storage=self._storage(),
            redact=self._redact,
        )
        return web.Response(
            status=status, text=json.dumps(body, ensure_ascii=False), content_type="application/json"
        )

    async def _metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE})
