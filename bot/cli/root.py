"""The ``membot`` app object, its global options, and how subcommands get settings."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text
from typer import _click as click  # typer's own copy of click (0.29+), which its classes extend
from typer.core import TyperGroup

from bot.errors import ChannelError, ConfigError, InUseError, LLMError, MembotError, StorageError

if TYPE_CHECKING:
    from bot.config import Settings

# Import placement: `membot --help` must stay fast, so this package imports at module level only typer,
# rich and light modules of ours. Settings (pydantic), httpx, memory (numpy, simplemma), channel
# libraries and tiktoken are imported inside the commands that use them (tests/bot/test_imports.py).

WHOLE_SENTENCE = 300  # characters of a command's first sentence shown in a command list

# Exit statuses a supervisor can tell apart (sysexits.h where one fits). systemd's unit
# (deploy/membot.service) does not restart a 78: a wrong setting stays wrong until someone fixes it.
EXIT_FAILED = 1  # a channel failed (bot/lifecycle.py), a folder cannot be used, a doctor check failed
EXIT_USAGE = 2  # click's status for a wrong command line; ours when what it names is not there
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: a service the command needs (the model, a chat platform) failed
EXIT_IO = 74  # EX_IOERR: a workspace file could not be read or written (StorageError); the disk, not a typo
EXIT_IN_USE = 75  # EX_TEMPFAIL: another process holds the workspace or the admin port; try again later
EXIT_CONFIG = 78  # EX_CONFIG: a setting or file is wrong; the message says which and how to fix it


class Group(TyperGroup):
    """Click's plain help, with each command's first sentence whole (wrapped, not cut at one line).

    Not typer's rich help: its formatter imports a Markdown parser, a third of ``membot --help``'s time
    (0.37 against 0.26 s here). The app and every :func:`command_group` are made with it."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=WHOLE_SENTENCE)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def command_group(help: str) -> typer.Typer:
    """A group of subcommands (``membot memory ...``), with the same plain help as the app."""
    return typer.Typer(help=help, no_args_is_help=True, rich_markup_mode=None, cls=Group)


app = typer.Typer(
    name="membot",
    help="membot: a self-hosted chat bot (Telegram, Discord, terminal) that never forgets a conversation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=Group,
)

# No markup in what is printed: chat text, session ids, paths and error messages hold brackets ("[/x]"
# raised MarkupError, "[docs](url)" lost a word). Styled parts are rich Text objects instead.
console = Console(markup=False)
err_console = Console(stderr=True, soft_wrap=True, markup=False)


class LogLevel(StrEnum):
    """``--log-level``'s choices: the settings' ``log_level``."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


@dataclass(frozen=True, slots=True)
class CliOptions:
    config: Path | None
    workspace: Path | None
    log_level: str | None


@app.callback()
def _global(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", help="TOML config file (default: $MEMBOT_CONFIG or ~/.membot/membot.toml)."
        ),
    ] = None,
    workspace: Annotated[
        Path | None,
        typer.Option(
            "--workspace",
            "-w",
            help="Workspace folder with sessions/ and memory/ (default ~/.membot/workspace).",
        ),
    ] = None,
    log_level: Annotated[
        LogLevel | None,
        typer.Option(
            "--log-level",
            # Checked here, so a wrong one names the flag: checked with the settings, it said "set
            # MEMBOT_LOG_LEVEL", a variable the operator had not set.
            case_sensitive=False,
            help="How much to log (default: MEMBOT_LOG_LEVEL, else INFO).",
        ),
    ] = None,
) -> None:
    ctx.obj = CliOptions(config, workspace, log_level.value if log_level else None)


def options(ctx: typer.Context) -> CliOptions:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, CliOptions) else CliOptions(None, None, None)


def overrides_from(opts: CliOptions) -> dict[str, Any]:
    """The settings the global flags set (``--workspace``, ``--log-level``), above every other source."""
    overrides: dict[str, Any] = {}
    if opts.workspace is not None:
        overrides["workspace"] = opts.workspace
    if opts.log_level is not None:
        overrides["log_level"] = opts.log_level
    return overrides


def settings_from(ctx: typer.Context) -> Settings:
    """Load settings with the global flags applied; a config problem ends the command with a clear message."""
    try:
        return load_checked(ctx)
    except ConfigError as exc:
        fail(str(exc), EXIT_CONFIG)


def load_checked(ctx: typer.Context) -> Settings:
    """:func:`settings_from` for a command that reports a :class:`ConfigError` its own way."""
    from bot.config import load_settings

    opts = options(ctx)
    settings = load_settings(opts.config, overrides=overrides_from(opts))
    # The workspace, or a folder it would be made in, is a file ("error: …/ws/memory: Not a directory"
    # said neither what nor how to fix it).
    blocking = next((p for p in (settings.workspace, *settings.workspace.parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        what = "is a file" if blocking == settings.workspace else f"cannot be made: {blocking} is a file"
        raise ConfigError(
            f"the workspace {settings.workspace} {what}: point --workspace or MEMBOT_WORKSPACE at a folder"
        )
    _hide(settings)
    return settings


# What no line of a command may show: its settings' tokens and keys, once they are loaded.
_secrets: list[str] = []


def _hide(settings: Settings) -> None:
    """Every command's log (to stderr, off stdout's data) and error lines mask the settings' secrets and
    anything credential-shaped, as ``membot run``'s log does; ``run`` and ``chat`` set up their own log
    after this."""
    from bot.logging import configure_logging

    _secrets[:] = settings.secrets
    configure_logging(level=settings.log_level, fmt=settings.log_format, secrets=_secrets)


def masked(message: str) -> str:
    """``message`` as a command may print it: the settings' secrets and credential-shaped text masked."""
    from bot.logging import SecretRedactor

    return SecretRedactor(_secrets).redact(message)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    err_console.print(Text.assemble(("error:", "bold red"), " ", masked(message)), highlight=False)
    raise typer.Exit(code)


def main() -> None:
    # Subcommand modules register themselves on `app` when imported; import them here, not at the top,
    # so `membot --help` does not load channel libraries.
    from bot.cli import core, doctor, memory, pairing, sessions  # noqa: F401

    try:
        app()
    except MembotError as exc:  # anything that escaped a command: one clear line, no traceback
        err_console.print(Text.assemble(("error:", "bold red"), " ", masked(str(exc))), highlight=False)
        sys.exit(exit_code(exc))
    except OSError as exc:  # a folder that cannot be made or read: what and where, no traceback
        where = f"{exc.filename}: " if exc.filename else ""
        said = masked(f"{where}{exc.strerror or exc}")
        err_console.print(Text.assemble(("error:", "bold red"), " ", said), highlight=False)
        sys.exit(EXIT_FAILED)


def exit_code(exc: MembotError) -> int:
    """The exit status of a command that ``exc`` ended.

    Never click's 2 (a wrong command line): a script must tell "typed it wrong" from "the disk
    refused" or "the model is down". A :class:`StorageError` is 74 (EX_IOERR) rather than EX_CANTCREAT
    (73): the error covers reads as well as writes of files that already exist, and 73 means an output
    file that cannot be created. An :class:`LLMError` or a :class:`ChannelError` is 69
    (EX_UNAVAILABLE): a service the command needs failed or refused it; the message names which."""
    if isinstance(exc, ConfigError):
        return EXIT_CONFIG
    if isinstance(exc, StorageError):
        return EXIT_IO
    if isinstance(exc, LLMError | ChannelError):
        return EXIT_UNAVAILABLE
    return EXIT_IN_USE if isinstance(exc, InUseError) else EXIT_USAGE
