"""Where a provider is reached: its base URL checked at start-up, and named in errors without secrets."""

from __future__ import annotations

import re

import httpx

from bot.config import ProviderSettings
from bot.errors import ConfigError
from bot.llm import openai
from bot.llm.failures import Provider


def where(provider: Provider, settings: ProviderSettings) -> str:
    """The server as an error names it for the operator ("OpenAI", "the ... server at URL")."""
    if provider == "anthropic":
        official = settings.base_url is None or "api.anthropic.com" in settings.base_url
        return (
            "Anthropic" if official else f"the Anthropic-compatible server at {shown_url(settings.base_url)}"
        )
    if openai.is_official(settings.base_url):
        return "OpenAI"
    return f"the OpenAI-compatible server at {shown_url(settings.base_url)}"


def shown_url(base_url: str | None) -> str:
    """A base URL as errors may show it: without the user:password a proxy URL can carry."""
    try:
        return str(httpx.URL(base_url or "").copy_with(username=None, password=None))
    except httpx.InvalidURL:
        return re.sub(r"//[^/]*@", "//", base_url or "")


def check_base_url(section: str, base_url: str | None) -> None:
    """Fail at start-up, naming the setting, rather than on every call."""
    if base_url is None:
        return
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        example = "http://localhost:11434/v1" if section == "openai" else "https://api.anthropic.com"
        raise ConfigError(
            f"llm.{section}.base_url {shown_url(base_url)!r} is not an http(s) URL: set "
            f"MEMBOT_LLM__{section.upper()}__BASE_URL to something like {example}"
        )
