"""``membot run``: every configured channel, and the ops endpoints when enabled, served until a signal.

The bot is the one :func:`bot.app.build_core` builds; channels are built and started by
:func:`bot.app.start_channel`, in the order and with the failure policy of
:class:`~bot.lifecycle.ServiceRunner`. ``/healthz`` and ``/metrics`` (:func:`serve_ops`) run in the
bot's own loop and close with ``core.edge``, after the channels. aiohttp and prometheus_client are
imported only when ``admin.enabled`` is set.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from bot.app import Core, build_core, start_channel
from bot.channel_choice import configured_channels
from bot.config import Settings
from bot.errors import ConfigError
from bot.lifecycle import EXIT_OK, ServiceRunner
from bot.logging import SecretRedactor, configure_logging

if TYPE_CHECKING:
    from bot.admin import AdminServer
    from bot.metrics import Metrics

log = structlog.get_logger(__name__)


async def run_service(settings: Settings) -> int:
    """``membot run``: every configured channel until SIGTERM/SIGINT. Returns the exit code."""
    redactor = configure_logging(level=settings.log_level, fmt=settings.log_format, secrets=settings.secrets)
    wanted = configured_channels(settings)
    if not wanted:
        raise ConfigError(
            "no channel is configured. Set MEMBOT_TELEGRAM__TOKEN (Telegram), MEMBOT_DISCORD__TOKEN "
            "(Discord) or MEMBOT_TERMINAL__ENABLED=true (terminal), or use `membot chat` for a terminal chat."
        )
    runner = ServiceRunner(settings.lifecycle)
    metrics: Metrics | None = None
    if settings.admin.enabled:  # only /metrics reads them; prometheus_client loads only then
        from bot.metrics import Metrics

        metrics = Metrics()
    # The signal handlers span the shutdown too: a second signal during the drain exits at once.
    with runner.handling_signals():
        async with build_core(settings, metrics=metrics) as core:
            if metrics is not None:
                await serve_ops(core, metrics, runner, redactor)
            log.info("membot_starting", channels=wanted, model=settings.llm.model)
            look = asyncio.create_task(look_at_the_model(core, runner), name="look_at_the_model")
            try:
                code = await runner.serve(
                    wanted,
                    start_channel=lambda name: start_channel(name, core),
                    recover=core.dispatcher.recover,
                )
            finally:
                look.cancel()
                await asyncio.gather(look, return_exceptions=True)
        # build_core's exit stack has drained the dispatcher, flushed memory and stopped the channels.
    if code == EXIT_OK:
        log.info("membot_stopped")
    return code


async def look_at_the_model(core: Core, runner: ServiceRunner) -> None:
    """Once membot is ready, ask each model endpoint for its model list, as ``membot doctor`` does, and
    log a warning with the setting to check when one is down, refuses the key or lacks the model.
    Otherwise the first message would be the first to find out, and the operator would learn it from
    a user. It is one cheap ``GET``, after ``membot_started`` so it never delays readiness."""
    await runner.wait_started()
    from bot.online_checks import llm_endpoints

    for check in await llm_endpoints(core.settings, core.catalog):
        if check.status == "fail":
            log.warning("llm_check_failed", endpoint=check.name, error=check.detail, hint=check.hint)
        else:  # pass, or a warn (no model list to go by): nothing the operator must act on
            log.info("llm_checked", endpoint=check.name, status=check.status, detail=check.detail)


async def serve_ops(
    core: Core, metrics: Metrics, runner: ServiceRunner, redactor: SecretRedactor
) -> AdminServer:
    """/healthz and /metrics, served until ``core.edge`` closes (after the channels); returns the server.
    ``redactor``: the log's (configure_logging), so /healthz hides exactly what the log hides."""
    from bot.admin import AdminServer  # aiohttp, for the ops endpoints only

    stats = getattr(core.llm, "stats", None)  # the LLM client's; an injected model may have none
    metrics.watch(
        llm_stats=lambda: stats,
        queued=core.dispatcher.total_queued,
        running_turns=core.dispatcher.running_turns,
        active_sessions=lambda: core.sessions.cached,
        kept_answers=lambda: sum(core.inbox.kept_counts().values()),
    )
    admin = AdminServer(
        core.settings.admin,
        metrics,
        channels=runner.channel_health,
        llm_stats=lambda: stats,
        kept_answers=core.inbox.kept_counts,
        storage=core.dispatcher.storage_waits,
        redact=redactor.redact,
    )
    return await core.edge.enter_async_context(admin)
