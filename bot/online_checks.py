"""Online checks: the LLM endpoints list the configured models, channel tokens work.

``membot doctor`` runs them all; ``membot run`` runs :func:`llm_endpoints` once after start, to warn in
the log about a model endpoint that is down or refuses the key before the first message finds out.

Each is one cheap read-only request (``GET /v1/models``, Telegram ``getMe``, Discord ``GET /users/@me``),
answered whole within :data:`ONLINE_TIMEOUT` and at most :data:`PROBE_BYTES` long; nothing is sent to
any chat and no tokens are spent. Every failure is a fail line with a fix hint, never a traceback, and
URLs are shown without their secrets. Imported only when they are run.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from bot import model_choice
from bot.check import Check

if TYPE_CHECKING:
    import httpx

    from bot.catalog import ModelCatalog
    from bot.config import Settings

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


async def online(settings: Settings, catalog: ModelCatalog, *, probe_llm: bool) -> list[Check]:
    """The online checks, run together: the LLM endpoints (when ``probe_llm``), then each channel token."""
    import httpx

    async with httpx.AsyncClient(timeout=ONLINE_TIMEOUT) as http:
        probes: list[Awaitable[Check]] = [
            _llm_endpoint(http, settings, provider, models)
            for provider, models in (_providers(settings, catalog) if probe_llm else {}).items()
        ]
        probes.append(_telegram(http, settings))
        probes.append(_discord(http, settings))
        return list(await asyncio.gather(*probes))


async def llm_endpoints(settings: Settings, catalog: ModelCatalog) -> list[Check]:
    """The LLM endpoints' checks alone: each provider the model and its fallbacks use."""
    import httpx

    # Built in a thread: a client loads the CA certificates from disk.
    async with await asyncio.to_thread(httpx.AsyncClient, timeout=ONLINE_TIMEOUT) as http:
        return list(
            await asyncio.gather(
                *(
                    _llm_endpoint(http, settings, provider, models)
                    for provider, models in _providers(settings, catalog).items()
                )
            )
        )


def _providers(settings: Settings, catalog: ModelCatalog) -> dict[str, list[str]]:
    """Every provider the model and its fallbacks use, in order, with the model ids each must serve."""
    seen: dict[str, list[str]] = {}
    for model in [settings.llm.model, *settings.llm.fallback_models]:
        provider = model_choice.provider_of(settings.llm, catalog, model)
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
