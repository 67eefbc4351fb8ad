"""``membot doctor``: check an installation before (or instead of) reading a stack trace.

Each check prints one pass/warn/fail/skip line, and a fix hint when it did not pass. Offline checks: the
configuration, the workspace and its permissions, models.json, the LLM settings. Online checks (skipped
with ``--offline``; bot/online_checks.py): the LLM endpoint answers its cheap model listing
(``GET /v1/models``) with the configured key and lists the configured model and fallbacks, and each
configured channel token is accepted (Telegram ``getMe``, Discord ``GET /users/@me``). Nothing is sent
to any chat and no tokens are spent. Exit status 1 when any check failed.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from bot.check import Check
from bot.cli.root import app, console, options, overrides_from
from bot.errors import ConfigError

if TYPE_CHECKING:
    from bot.catalog import ModelCatalog
    from bot.config import Settings

_MARK = {
    "pass": "[green]✓ pass[/]",
    "warn": "[yellow]! warn[/]",
    "fail": "[red]✗ fail[/]",
    "skip": "[dim]- skip[/]",
}


@app.command()
def doctor(
    ctx: typer.Context,
    offline: Annotated[
        bool, typer.Option("--offline", help="Skip the checks that need the network.")
    ] = False,
) -> None:
    """Check config, workspace, models.json and (online) the LLM endpoint, its model and channel tokens."""
    checks: list[Check] = []
    settings, check = _config(ctx)
    checks.append(check)
    if settings is not None:
        checks.append(_workspace(settings.workspace))
        checks.append(_kept_answers(settings))
        checks.append(_channels(settings))
        catalog, check = _catalog(settings)
        checks.append(check)
        if catalog is not None:
            llm = _llm_settings(settings, catalog)
            checks.append(llm)
            if offline:
                checks.append(
                    Check("online", "skip", "--offline: LLM endpoint and channel tokens not checked")
                )
            else:
                from bot.online_checks import online

                checks.extend(asyncio.run(online(settings, catalog, probe_llm=llm.status == "pass")))
    failed = _print(checks)
    raise typer.Exit(1 if failed else 0)


def _print(checks: list[Check]) -> int:
    # A grid keeps wrapped details and hints aligned under their check in an 80-column terminal.
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for c in checks:
        grid.add_row(Text.from_markup(_MARK[c.status]), c.name, Text(c.detail))
        if c.hint and c.status in ("warn", "fail"):
            grid.add_row("", "", Text.assemble(("fix: ", "bold"), c.hint))
    console.print(grid)
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    passed = "All checks passed" + (f", {warned} with a warning (see fix:)." if warned else ".")
    console.print(
        f"\n{failed} check(s) failed." if failed else f"\n{passed}",
        style="red" if failed else "green",
    )
    return failed


# ---- offline ---------------------------------------------------------------------------------------


def _config(ctx: typer.Context) -> tuple[Settings | None, Check]:
    from bot.config import load_settings, resolve_config_file

    opts = options(ctx)
    try:
        source = resolve_config_file(opts.config)
        settings = load_settings(opts.config, overrides=overrides_from(opts))
    except ConfigError as exc:
        hint = "correct the named setting in the config file or environment (see deploy/membot.example.toml)"
        return None, Check("config", "fail", str(exc), hint)
    return settings, Check("config", "pass", f"loaded ({source or 'no config file'}; env and .env applied)")


def _channels(settings: Settings) -> Check:
    """``membot run`` refuses to start without a channel: a service that passed doctor must start."""
    from bot.channel_choice import configured_channels

    names = configured_channels(settings)
    if names:
        return Check("channels", "pass", ", ".join(names))
    return Check(
        "channels",
        "warn",
        "none configured: membot run would not start (membot chat needs none)",
        "set MEMBOT_TELEGRAM__TOKEN or MEMBOT_DISCORD__TOKEN, or MEMBOT_TERMINAL__ENABLED=true",
    )


def _workspace(path: Path) -> Check:
    """The workspace must be a folder this user can write; private (0700) because it holds chats."""
    name = "workspace"
    if not path.exists():
        parent = _existing_parent(path)
        if parent is not None and os.access(parent, os.W_OK | os.X_OK):
            return Check(name, "pass", f"{path} does not exist yet; it will be created (0700)")
        return Check(
            name,
            "fail",
            f"{path} does not exist and {parent or 'its parent'} is not writable",
            "create it for the service user (mkdir -m 700) or set MEMBOT_WORKSPACE / --workspace",
        )
    if not path.is_dir():
        return Check(name, "fail", f"{path} is not a folder", "point MEMBOT_WORKSPACE at a folder")
    # A folder this user cannot enter hides what is in it (stat raises): its own failure is the finding.
    unwritable = (
        [path]
        if not _writable(path)
        else [p for p in (path / "sessions", path / "memory") if p.exists() and not _writable(p)]
    )
    if unwritable:
        return Check(
            name,
            "fail",
            f"not writable by this user: {', '.join(map(str, unwritable))}",
            _write_fix(path, unwritable),
        )
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return Check(
            name,
            "warn",
            f"{path} is readable by others (mode {mode:o}); membot tightens it to 700 at start",
            f"chmod -R go-rwx {path}",
        )
    return Check(name, "pass", f"{path} (mode {mode:o}, writable)")


def _write_fix(workspace: Path, unwritable: list[Path]) -> str:
    """How to make ``unwritable`` writable, by its cause: a ``chown`` fixes a folder of another user (a
    restore as root), but not one of this user without its write bit (a ``chmod -R a-w``, a copy from
    read-only media), nor one whose mode allows writing on a read-only mount."""
    modes = [_own_mode(p) for p in unwritable]
    if any(mode is None for mode in modes):
        return f"chown -R {_user()} {workspace} (run membot as the workspace's owner)"
    if any(mode is not None and not (mode & stat.S_IWUSR and mode & stat.S_IXUSR) for mode in modes):
        return f"chmod -R u+rwX {workspace} (the folder is yours but you may not write in it)"
    return (
        f"{workspace} is yours and its mode allows writing, yet writing is refused: remount its file "
        f"system read-write (findmnt -T {workspace} shows ro), or clear its immutable flag (lsattr -d)"
    )


def _own_mode(path: Path) -> int | None:
    """``path``'s permission bits when this user owns it; None when another user does."""
    try:
        info = path.stat()
    except OSError:
        return None
    return stat.S_IMODE(info.st_mode) if info.st_uid == os.geteuid() else None


def _kept_answers(settings: Settings) -> Check:
    """Answers a platform refused (a user blocked the bot, a channel is gone) wait in the inbox; the
    log says why once, so this is where an operator who missed it sees that some chats get nothing."""
    from bot.inbox import EXPIRED
    from bot.inbox_file import kept_on_disk

    inbox = settings.workspace / "inbox"
    try:
        kept = kept_on_disk(inbox)
        expired = f"; older ones are in {inbox / EXPIRED}" if (inbox / EXPIRED).is_dir() else ""
    except OSError as exc:  # a workspace this user cannot read: the workspace line says how to fix it
        return Check("kept answers", "skip", f"cannot read {inbox}: {exc.strerror or exc}")
    if not kept:
        return Check("kept answers", "pass", f"none waiting in {inbox}{expired}")
    chats = ", ".join(f"{sid} ({n})" for sid, n in sorted(kept.items()))
    days = settings.dispatcher.kept_reply_max_age / 86400
    until = f"for {days:g} days" if days else "until delivered"
    return Check(
        "kept answers",
        "warn",
        f"{sum(kept.values())} answer(s) not delivered, kept in {inbox}: {chats}{expired}",
        "the platform refused these chats: reply_refused in the log says why and how to fix it. Each is "
        f"tried again before its chat's next answer and at every start, {until} "
        "(dispatcher.kept_reply_max_age)",
    )


def _existing_parent(path: Path) -> Path | None:
    for parent in path.parents:
        if parent.exists():
            return parent
    return None


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0))


def _user() -> str:
    """Who runs the doctor, as ``chown`` takes it: not ``$USER``, which ``su`` and ``setpriv`` keep."""
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a uid with no name (a container's): chown takes the number
        return str(os.geteuid())


def _catalog(settings: Settings) -> tuple[ModelCatalog | None, Check]:
    from bot.catalog import load_catalog

    where = str(settings.models_file) if settings.models_file else "packaged models.json"
    try:
        catalog = load_catalog(settings.models_file)
    except ConfigError as exc:
        return None, Check(
            "models.json", "fail", str(exc), "fix the file named above, or unset MEMBOT_MODELS_FILE"
        )
    return catalog, Check("models.json", "pass", f"{len(catalog.models)} models ({where})")


def _llm_settings(settings: Settings, catalog: ModelCatalog) -> Check:
    from bot.startup import check_llm_configured

    try:
        check_llm_configured(settings, catalog)
    except ConfigError as exc:
        first, _, rest = str(exc).partition("\n")
        hint = (
            "set MEMBOT_LLM__OPENAI__API_KEY; or MEMBOT_LLM__ANTHROPIC__API_KEY with an Anthropic "
            "MEMBOT_LLM__MODEL; or MEMBOT_LLM__OPENAI__BASE_URL for a local server such as "
            "http://localhost:11434/v1 (Ollama)"
            if rest
            else "set the setting named above"
        )
        return Check("llm settings", "fail", first, hint)
    from bot.llm import check_base_url

    try:  # as `membot run` and `chat` check it: "localhost:11434" (no http://) is refused at their start
        check_base_url("openai", settings.llm.openai.base_url)
        check_base_url("anthropic", settings.llm.anthropic.base_url)
    except ConfigError as exc:
        return Check("llm settings", "fail", str(exc), "set the setting named above")
    known = "" if settings.llm.model in catalog else " (not in the catalog: treated as a local model)"
    keyless = {m: p for m in settings.llm.fallback_models if (p := _keyless_provider(settings, catalog, m))}
    if keyless:  # failover to it would fail too, when it is needed most (the primary is down)
        variables = " or ".join(sorted({f"MEMBOT_LLM__{p.upper()}__API_KEY" for p in keyless.values()}))
        return Check(
            "llm settings",
            "warn",
            f"model {settings.llm.model}{known}; fallback {', '.join(keyless)} cannot be asked: no API key "
            "for its provider",
            f"set {variables}, or take it out of MEMBOT_LLM__FALLBACK_MODELS",
        )
    return Check("llm settings", "pass", f"model {settings.llm.model}{known}")


def _keyless_provider(settings: Settings, catalog: ModelCatalog, model: str) -> str | None:
    """The provider of fallback ``model`` when it has no key to be asked with (as the online check picks
    it): Anthropic always wants one, an OpenAI-compatible server of one's own (base_url) may not."""
    from bot import model_choice

    provider = model_choice.provider_of(settings.llm, catalog, model)
    conf = settings.llm.anthropic if provider == "anthropic" else settings.llm.openai
    if conf.api_key is not None or (provider == "openai" and conf.base_url is not None):
        return None
    return provider
