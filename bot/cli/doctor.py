"""``membot doctor``: check an installation before (or instead of) reading a stack trace.

Each check prints one pass/warn/fail/skip line, and a fix hint when it did not pass. Offline checks: the
configuration, the workspace and its permissions, models.json, the LLM settings. Online checks (skipped
with ``--offline``): the LLM endpoint answers its cheap model listing (``GET /v1/models``) with the
configured key and lists the configured model and fallbacks, and each configured channel token is
accepted (Telegram ``getMe``, Discord ``GET /users/@me``). Nothing is sent to any chat and no tokens
are spent. Exit status 1 when any check failed.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.table import Table
from rich.text import Text

from bot.cli.root import app, console, options, overrides_from
from bot.errors import ConfigError

if TYPE_CHECKING:
    import httpx

    from bot.catalog import ModelCatalog
    from bot.config import Settings
    from bot.llm import Provider

Status = Literal["pass", "warn", "fail", "skip"]
_MARK = {
    "pass": "[green]✓ pass[/]",
    "warn": "[yellow]! warn[/]",
    "fail": "[red]✗ fail[/]",
    "skip": "[dim]- skip[/]",
}

OPENAI_API = "https://api.openai.com/v1"
ANTHROPIC_API = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
TELEGRAM_API = "https://api.telegram.org/bot"
DISCORD_API = "https://discord.com/api/v10"
ONLINE_TIMEOUT = 10.0
# The most of one answer a check reads. The largest is a model list: a proxy's every model, a few KiB
# each, some hundreds of KiB in all. More is no such API (or one that loops), and was read until
# doctor ran out of memory: its per-read timeout never ends a flood.
PROBE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str
    hint: str = ""


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
                checks.extend(asyncio.run(_online(settings, catalog, probe_llm=llm.status == "pass")))
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
    from bot.app import configured_channels

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
    unwritable = [p for p in (path, path / "sessions", path / "memory") if p.exists() and not _writable(p)]
    if unwritable:
        return Check(
            name,
            "fail",
            f"not writable by this user: {', '.join(map(str, unwritable))}",
            f"chown -R {_user()} {path} (run membot as the workspace's owner)",
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


def _kept_answers(settings: Settings) -> Check:
    """Answers a platform refused (a user blocked the bot, a channel is gone) wait in the inbox; the
    log says why once, so this is where an operator who missed it sees that some chats get nothing."""
    from bot.inbox import EXPIRED, kept_on_disk

    inbox = settings.workspace / "inbox"
    kept = kept_on_disk(inbox)
    expired = f"; older ones are in {inbox / EXPIRED}" if (inbox / EXPIRED).is_dir() else ""
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
    return os.environ.get("USER") or str(os.getuid())


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
    known = "" if settings.llm.model in catalog else " (not in the catalog: treated as a local model)"
    return Check("llm settings", "pass", f"model {settings.llm.model}{known}")


# ---- online ----------------------------------------------------------------------------------------


async def _online(settings: Settings, catalog: ModelCatalog, *, probe_llm: bool) -> list[Check]:
    import httpx

    async with httpx.AsyncClient(timeout=ONLINE_TIMEOUT) as http:
        probes: list[Awaitable[Check]] = [
            _llm_endpoint(http, settings, provider, models)
            for provider, models in (_providers(settings, catalog) if probe_llm else {}).items()
        ]
        probes.append(_telegram(http, settings))
        probes.append(_discord(http, settings))
        return list(await asyncio.gather(*probes))


def _providers(settings: Settings, catalog: ModelCatalog) -> dict[str, list[str]]:
    """Every provider the model and its fallbacks use, in order, with the model ids each must serve."""
    seen: dict[str, list[str]] = {}
    for model in [settings.llm.model, *settings.llm.fallback_models]:
        if model == settings.llm.model and settings.llm.provider:
            provider: Provider = settings.llm.provider
        else:
            provider = catalog.get(model).provider if model in catalog else settings.llm.provider or "openai"
        wire_id = catalog.get(model, provider).id
        if wire_id not in seen.setdefault(provider, []):
            seen[provider].append(wire_id)
    return seen


async def _llm_endpoint(
    http: httpx.AsyncClient, settings: Settings, provider: str, models: list[str]
) -> Check:
    name = f"llm {provider}"
    if provider == "anthropic":
        conf = settings.llm.anthropic
        url = (conf.base_url or ANTHROPIC_API).rstrip("/") + "/v1/models?limit=1000"
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if conf.api_key:
            headers["x-api-key"] = conf.api_key.get_secret_value()
        key_setting, url_setting = "MEMBOT_LLM__ANTHROPIC__API_KEY", "MEMBOT_LLM__ANTHROPIC__BASE_URL"
    else:
        conf = settings.llm.openai
        url = (conf.base_url or OPENAI_API).rstrip("/") + "/models"
        headers = {}
        if conf.api_key:
            headers["authorization"] = f"Bearer {conf.api_key.get_secret_value()}"
        key_setting, url_setting = "MEMBOT_LLM__OPENAI__API_KEY", "MEMBOT_LLM__OPENAI__BASE_URL"
    return await _probe(
        http,
        name,
        "GET",
        url,
        headers,
        ok=lambda body: _served(name, _public(url), body, models),
        auth_hint=f"the key was rejected: check {key_setting}",
        reach_hint=f"check {url_setting} and that the server is running and reachable",
    )


def _served(name: str, shown: str, body: Any, models: list[str]) -> Check:
    """Pass when the listing has every model we will ask for; a model it lacks fails every message."""
    data = body.get("data") if isinstance(body, dict) else None
    listed = [str(m.get("id")) for m in data if isinstance(m, dict)] if isinstance(data, list) else None
    if listed is None:
        return Check(
            name, "warn", f"{shown} answered without a model list", "check MEMBOT_LLM__MODEL by hand"
        )
    missing = [m for m in models if not any(_same_model(m, listed_id) for listed_id in listed)]
    if not missing:
        return Check(
            name, "pass", f"{shown} answered ({len(listed)} models listed, {', '.join(models)} among them)"
        )
    more = isinstance(body, dict) and body.get("has_more") is True  # a partial listing proves nothing
    examples = ", ".join(listed[:8]) + (", ..." if len(listed) > 8 else "")
    return Check(
        name,
        "warn" if more else "fail",
        f"{shown} answered, but does not list {', '.join(missing)} ({len(listed)} models listed)",
        "set MEMBOT_LLM__MODEL (and MEMBOT_LLM__FALLBACK_MODELS) to a model the server lists"
        + (f": {examples}" if examples else "")
        + "; on Ollama, `ollama pull <model>` first",
    )


def _same_model(wanted: str, listed: str) -> bool:
    """``llama3.1`` is Ollama's ``llama3.1:latest``; ``claude-sonnet-4-5`` names its dated snapshot."""
    if listed in (wanted, f"{wanted}:latest"):
        return True
    return listed.startswith(wanted) and re.fullmatch(r"-\d[\d-]*", listed[len(wanted) :]) is not None


async def _telegram(http: httpx.AsyncClient, settings: Settings) -> Check:
    conf = settings.telegram
    if conf.token is None:
        return Check("telegram", "skip", "not configured (MEMBOT_TELEGRAM__TOKEN)")
    base = conf.base_url or TELEGRAM_API
    url = f"{base}{conf.token.get_secret_value()}/getMe"

    def ok(body: Any) -> str:
        result = body.get("result") if isinstance(body, dict) else None
        user = result.get("username") if isinstance(result, dict) else None
        return f"token accepted (bot @{user})" if user else "token accepted"

    return await _probe(
        http,
        "telegram",
        "GET",
        url,
        {},
        ok=ok,
        auth_hint="the token was rejected: get it again from @BotFather and set MEMBOT_TELEGRAM__TOKEN",
        reach_hint="check network access to the Bot API (or MEMBOT_TELEGRAM__BASE_URL)",
        shown_url=_public(base) + "<token>/getMe",
        auth_statuses=(401, 403, 404),  # the Bot API answers 404 for an unknown token
    )


async def _discord(http: httpx.AsyncClient, settings: Settings) -> Check:
    conf = settings.discord
    if conf.token is None:
        return Check("discord", "skip", "not configured (MEMBOT_DISCORD__TOKEN)")
    url = (conf.api_base or DISCORD_API).rstrip("/") + "/users/@me"

    def ok(body: Any) -> str:
        user = body.get("username") if isinstance(body, dict) else None
        return f"token accepted (bot {user})" if user else "token accepted"

    return await _probe(
        http,
        "discord",
        "GET",
        url,
        {"authorization": f"Bot {conf.token.get_secret_value()}"},
        ok=ok,
        auth_hint="the token was rejected: reset it in the Developer Portal and set MEMBOT_DISCORD__TOKEN",
        reach_hint="check network access to discord.com (or MEMBOT_DISCORD__API_BASE)",
    )


async def _probe(
    http: httpx.AsyncClient,
    name: str,
    method: str,
    url: str,
    headers: dict[str, str],
    *,
    ok: Callable[[Any], str | Check],
    auth_hint: str,
    reach_hint: str,
    shown_url: str | None = None,
    auth_statuses: tuple[int, ...] = (401, 403),
) -> Check:
    """One request, answered whole within ``ONLINE_TIMEOUT`` (httpx's timeout is per read: a server
    sending a byte now and then kept it going); every httpx error becomes a fail line (secrets never
    appear: URLs are shown masked)."""
    import json

    import httpx

    from bot.capped import read_at_most

    shown = shown_url or _public(url)
    content: bytes | None = b""
    try:
        async with asyncio.timeout(ONLINE_TIMEOUT), http.stream(method, url, headers=headers) as response:
            if response.status_code < 400:
                content = await read_at_most(response.aiter_bytes(), PROBE_BYTES)
    except (httpx.TimeoutException, TimeoutError):
        return Check(name, "fail", f"{shown}: no answer within {ONLINE_TIMEOUT:g} s", reach_hint)
    except httpx.HTTPError as exc:
        return Check(name, "fail", f"{shown}: cannot connect ({type(exc).__name__})", reach_hint)
    except Exception as exc:  # a port past 65535, a token httpx cannot send: a fail line, not a traceback
        return Check(name, "fail", f"{shown}: cannot be asked ({type(exc).__name__})", reach_hint)
    if response.status_code in auth_statuses:
        return Check(name, "fail", f"{shown}: HTTP {response.status_code}", auth_hint)
    if response.status_code >= 400:
        return Check(name, "fail", f"{shown}: HTTP {response.status_code}", reach_hint)
    if content is None:
        more = f"{shown}: sent over {PROBE_BYTES // 2**20} MiB, more than this API answers"
        return Check(name, "fail", more, reach_hint)
    try:
        body: Any = json.loads(content)
    except ValueError:
        body = None
    verdict = ok(body)
    return verdict if isinstance(verdict, Check) else Check(name, "pass", verdict)


def _public(url: str) -> str:
    """``url`` as a check line shows it: without the user:password a proxy's base URL may carry (which
    ``membot config`` and the log mask too) and without its query (``?key=...``)."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        from bot.logging import redact_shapes

        return redact_shapes(url)
    return str(parsed.copy_with(username=None, password=None, query=None, fragment=None))
