"""What a provider's error answer means: HTTP status, headers and body mapped to membot's LLM errors.

Pure functions, shared by both wire formats and by mid-stream ``error`` events. The mapping decides the
error *type*; the client's retry and failover then decide by type alone:

    401, 403                                  LLMAuthError      never retried: fix the key
    quota / spend limit / credit exhausted    LLMAuthError      never retried: add credit or raise the limit
    code "content_filter" (Azure OpenAI)      LLMContentFiltered  never retried: the prompt was declined
    413, "prompt is too long", ...            LLMContextOverflow  compaction must shrink the prompt
    429                                       LLMRateLimited    retried, honouring retry-after
    408, 409, 5xx, 529                        LLMUnavailable    retried, then failover
    404                                       LLMNotFound       unknown model or wrong base URL
    other 4xx                                 LLMBadResponse    the request was refused as built
"""

from __future__ import annotations

import email.utils
import html
import json
import re
import time
from collections.abc import Mapping
from typing import Any, Literal

from bot.errors import (
    LLMAuthError,
    LLMBadResponse,
    LLMContentFiltered,
    LLMContextOverflow,
    LLMError,
    LLMNotFound,
    LLMRateLimited,
    LLMUnavailable,
)

Provider = Literal["openai", "anthropic"]

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})

# Matched against the lower-cased error type, code and message. Deliberately not plain "billing": an
# ordinary OpenAI rate-limit message links to the billing page.
_SPEND_MARKERS = (
    "insufficient_quota",
    "billing_hard_limit",
    "exceeded your current quota",
    "credit balance",
    "spend limit",
    "spending limit",
    "usage limit",
)
_OVERFLOW_MARKERS = (
    "context_length_exceeded",
    "prompt is too long",
    "maximum context length",
    "context length",
    "context window",
    "context size",
    "context limit",  # Anthropic: "input length and `max_tokens` exceed context limit: ..."
    "too many tokens",
)
# Mid-stream errors carry only an error type; these are the statuses the same error has as a response.
STATUS_OF_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "server_error": 500,
    "overloaded_error": 529,
}


def key_setting(provider: Provider) -> str:
    """The environment variable that holds the provider's API key."""
    return f"MEMBOT_LLM__{provider.upper()}__API_KEY"


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """``retry-after-ms`` first, then ``retry-after`` as seconds (maybe fractional) or an HTTP date."""
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        try:
            return max(0.0, float(milliseconds) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def error_fields(text: str) -> tuple[str, str, str]:
    """``(type, code, message)`` from either provider's error body; raw text when it is not JSON, and
    for a web page (:func:`_page`) its title."""
    try:
        body: Any = json.loads(text)
    except (json.JSONDecodeError, TypeError, RecursionError):
        raw = (text or "").strip()
        return "", "", _page(raw) if raw[:1] == "<" else raw[:300]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return (
            str(error.get("type") or ""),
            str(error.get("code") or ""),
            str(error.get("message") or "")[:300],
        )
    if isinstance(error, str):
        return "", "", error[:300]
    if isinstance(body, dict) and "message" in body:
        return "", "", str(body["message"])[:300]
    return "", "", str(body)[:300]


_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)


def _page(html_text: str) -> str:
    """An error page a proxy answered with (nginx's, Cloudflare's "502: Bad gateway"), as the log
    should show it: its title. Its first 300 characters were markup (Cloudflare's are all comments and
    ``<html>`` variants), so the log of an outage never said which proxy failed, or how."""
    found = _TITLE.search(html_text[:20_000])
    title = " ".join(html.unescape(found.group(1)).split())[:200] if found else ""
    return f"a web page titled {title!r}" if title else "a web page (HTML) without a title"


def status_error(
    status: int,
    headers: Mapping[str, str],
    text: str,
    *,
    model: str,
    provider: Provider,
    where: str,
    mid_stream: bool = False,
) -> LLMError:
    """The error for an HTTP error answer. ``where`` names the server for the user ("OpenAI", ...)."""
    kind, code, message = error_fields(text)
    detail = message or kind or "no details"
    said = f"({kind or 'error'} mid-answer: {detail})" if mid_stream else f"(HTTP {status}: {detail})"
    markers = f"{kind} {code} {message}".lower()
    if status in (401, 403):
        action = "rejected the API key" if status == 401 else f"refused access to {model}"
        return LLMAuthError(
            f"{where} {action} {said}: check {key_setting(provider)}", model=model, status_code=status
        )
    if any(marker in markers for marker in _SPEND_MARKERS):
        return LLMAuthError(
            f"{where}: the account's quota or spend limit is used up {said}. Add credit or raise the "
            f"limit in the provider's console, or switch MEMBOT_LLM__MODEL to another provider",
            model=model,
            status_code=status,
        )
    if code == "content_filter":  # Azure OpenAI's filter flagged the prompt: it would again
        return LLMContentFiltered(
            f"{where} declined the request for {model}: its content filter flagged the prompt {said}",
            model=model,
            status_code=status,
        )
    if status == 413 or (
        status not in RETRY_STATUSES and any(marker in markers for marker in _OVERFLOW_MARKERS)
    ):
        return LLMContextOverflow(
            f"{model}: the conversation is longer than the model's window {said}",
            model=model,
            status_code=status,
        )
    if status == 429:
        return LLMRateLimited(
            f"{where} is rate-limiting {model} {said}",
            retry_after=retry_after_seconds(headers),
            model=model,
            status_code=status,
        )
    if status in RETRY_STATUSES or status >= 500:
        return LLMUnavailable(
            f"{where} is unavailable or overloaded for {model} {said}",
            retry_after=retry_after_seconds(headers),
            model=model,
            status_code=status,
        )
    if status == 404:
        base = f"MEMBOT_LLM__{provider.upper()}__BASE_URL"
        return LLMNotFound(
            f"{where} does not know model {model!r} or the URL {said}: check MEMBOT_LLM__MODEL "
            f"(and fallback_models) and {base} (OpenAI-compatible servers usually end in /v1)",
            model=model,
            status_code=status,
        )
    return LLMBadResponse(f"{where} refused the request for {model} {said}", model=model, status_code=status)


def named_status(kind: str, code: str) -> int:
    """The HTTP status an error sent with HTTP 200 stands for: its ``code`` when that is a status
    (proxies such as OpenRouter and LiteLLM send ``"code": 429``), else its type's, else 500."""
    if len(code) == 3 and code.isdecimal() and 400 <= int(code) < 600:  # (isdecimal: "²" is a digit)
        return int(code)
    return STATUS_OF_TYPE.get(kind or code, 500)


def stream_error(
    kind: str, message: str, *, model: str, provider: Provider, where: str, code: str = ""
) -> LLMError:
    """The error for an ``error`` event inside an HTTP 200 stream, classified like the same response:
    by the status its ``code`` names, else by its type (:func:`named_status`)."""
    status = named_status(kind, code)
    body = json.dumps({"error": {"type": kind or code, "message": message}})
    return status_error(status, {}, body, model=model, provider=provider, where=where, mid_stream=True)
