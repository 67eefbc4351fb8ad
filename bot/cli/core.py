"""``membot run``, ``chat``, ``config`` and ``models``."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich import box
from rich.table import Table

from bot.cli.root import (
    EXIT_CONFIG,
    EXIT_IN_USE,
    EXIT_IO,
    EXIT_UNAVAILABLE,
    app,
    console,
    exit_code,
    fail,
    load_checked,
    options,
    overrides_from,
    settings_from,
)
from bot.errors import ConfigError, MembotError

if TYPE_CHECKING:
    from bot.config import Settings

# What to do about a start that failed, by exit status: the "hint" of its JSON log line.
_START_HINTS = {
    EXIT_CONFIG: "fix the setting or file the error names, then start membot again (`membot doctor` "
    "checks them all); a restart alone cannot fix it",
    EXIT_IN_USE: "another process holds it: stop that one, or wait until it has stopped (a restart will "
    "try again)",
    EXIT_IO: "the disk refused a workspace file the error names: free space or fix its permissions (a "
    "restart will try again)",
    EXIT_UNAVAILABLE: "a service membot needs (the model endpoint, a chat platform) failed as the error "
    "says: check that it is up and reachable (a restart will try again)",
}


@app.command()
def run(ctx: typer.Context) -> None:
    """Start every configured channel (Telegram, Discord, terminal) and serve until stopped.

    Exit status: 0 after SIGTERM or SIGINT; 1 when a channel failed (lifecycle.on_channel_failure);
    74 when a workspace file cannot be read or written (the message names it); 75 when another process
    holds the workspace or the admin port (try again later); 78 when a setting or file is wrong (the
    message names it; restarting will not help). With JSON logs (log_format json,
    or auto off a terminal) an error that stops the start is a JSON log line too.
    """
    from bot.serve import run_service

    settings: Settings | None = None
    try:
        settings = load_checked(ctx)
        code = asyncio.run(run_service(settings))
    except MembotError as exc:
        _start_failed(settings, str(exc), exit_code(exc))
    raise typer.Exit(code)


def _start_failed(settings: Settings | None, error: str, code: int) -> NoReturn:
    """Say why ``membot run`` stopped as its log says things: a collector reading JSON lines gets one
    more (event ``membot_start_failed``, ``error``, ``hint``, ``exit_code``), not a plain line it cannot
    parse; a terminal gets the plain line. Settings that did not load have left the format unknown:
    then it is the default's (JSON off a terminal)."""
    if not _logs_json(settings):
        fail(error, code)
    import structlog

    if settings is None:
        from bot.logging import configure_logging

        configure_logging(fmt="auto")  # (credential shapes are masked still)
    hint = _START_HINTS.get(code, "`membot doctor` checks the installation and says what to fix")
    structlog.get_logger(__name__).error("membot_start_failed", error=error, hint=hint, exit_code=code)
    raise typer.Exit(code)


def _logs_json(settings: Settings | None) -> bool:
    from bot.logging import renders_json

    return renders_json(settings.log_format if settings is not None else "auto", sys.stderr)


@app.command()
def chat(
    ctx: typer.Context,
    user: Annotated[str | None, typer.Option(help="Whose conversation (session cli:<user>).")] = None,
) -> None:
    """Chat in this terminal through the real pipeline; the conversation is kept on disk.

    Ctrl-C while membot is answering stops that answer; Ctrl-C at the prompt, Ctrl-D or /quit ends the chat.
    At a terminal: line editing, and the arrow keys bring back earlier messages; a paste is one message.
    """
    from bot.terminal_chat import run_chat

    settings = settings_from(ctx)
    if user:
        settings = settings.model_copy(
            update={"terminal": settings.terminal.model_copy(update={"user": user})}
        )
    try:
        asyncio.run(run_chat(settings))
    except MembotError as exc:  # the status every command gives it (74 for a StorageError, not 1)
        fail(str(exc), exit_code(exc))
    except OSError as exc:  # the workspace or its log cannot be used: the log may not exist to say so
        fail(f"membot chat stopped: {exc.filename or settings.workspace}: {exc.strerror or exc}", 1)
    except Exception as exc:  # the traceback goes to the chat log, one line to the terminal
        import structlog

        structlog.get_logger(__name__).exception("chat_crashed")
        fail(f"membot chat stopped ({type(exc).__name__}); the details are in {settings.chat_log}", 1)


@app.command("config")
def show_config(ctx: typer.Context) -> None:
    """Show the effective settings, where each value came from, with secrets masked."""
    from bot.config import resolve_config_file
    from bot.config_describe import describe_settings

    settings = settings_from(ctx)
    config_file = resolve_config_file(options(ctx).config)
    # On its own line, never cut: a table title is truncated to the terminal's width.
    console.print(f"config file: {config_file or 'none'}", soft_wrap=True, highlight=False, markup=False)
    table = Table(title="membot settings", expand=False)
    table.add_column("setting", overflow="fold")
    table.add_column("value", overflow="fold", max_width=40)
    table.add_column("from", overflow="fold")
    for name, value, origin in describe_settings(settings, options(ctx).config, overrides_from(options(ctx))):
        table.add_row(name, value, origin)
    console.print(table)


@app.command()
def models(ctx: typer.Context) -> None:
    """List the model catalog: windows, abilities, prices and tiers."""
    from bot.catalog import load_catalog

    settings = settings_from(ctx)
    try:
        catalog = load_catalog(settings.models_file)
    except ConfigError as exc:
        fail(str(exc), EXIT_CONFIG)
    table = Table(
        title="Model catalog (price: USD per million tokens in/out)", box=box.SIMPLE_HEAD, pad_edge=False
    )
    table.add_column("model", no_wrap=True)
    for column in ("provider", "context", "output", "vision", "price", "tier"):
        table.add_column(column, no_wrap=True, min_width=len(column))
    for info in catalog.models:
        table.add_row(
            info.id + (" *" if info.id == settings.llm.model else ""),
            info.provider,
            _tokens(info.max_input_tokens),
            _tokens(info.max_output_tokens),
            "✓" if info.supports_vision else "",
            f"{info.input_price:g}/{info.output_price:g}",
            catalog.tier_of(info.id) or "",
        )
    console.print(table)
    console.print(f"* active model: {settings.llm.model}")


def _tokens(count: int) -> str:
    return f"{count / 1_000_000:.2g}M" if count >= 1_000_000 else f"{count // 1000}k"
