"""httpx's exceptions mapped to membot's LLM errors: the one place the LLM layer catches them.

Like httpx's own ``map_httpcore_exceptions``, every library error leaves as the most specific
bot.errors type, ``from`` the original; tests/bot/llm/test_httpx_errors.py proves the map is total.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx

from bot.errors import LLMBadResponse, LLMError, LLMTimeout, LLMUnavailable
from bot.llm.failures import Provider, status_error

# Every exception httpx defines derives from one of these (tests/bot/llm/test_httpx_errors.py).
HTTPX_ERRORS = (httpx.HTTPError, httpx.InvalidURL, httpx.CookieConflict, httpx.StreamError)


@contextlib.contextmanager
def httpx_errors(*, model: str, provider: Provider, where: str) -> Iterator[None]:
    """Run httpx code; re-raise whatever it raises as a bot.errors LLM error (like httpcore's map)."""
    try:
        yield
    except HTTPX_ERRORS as exc:
        raise map_httpx_error(exc, model=model, provider=provider, where=where) from exc


def map_httpx_error(exc: Exception, *, model: str, provider: Provider, where: str) -> LLMError:
    """The LLM error for any exception httpx raises; the most specific httpx class wins.

    Timeouts are LLMTimeout; network failures LLMUnavailable (both retried); a URL that cannot be
    requested, a body that cannot be decoded, redirect loops and misuse of a stream are LLMBadResponse
    (not retried: another try cannot help).
    """
    name = type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        stage = {"ConnectTimeout": "connecting to", "PoolTimeout": "waiting for a connection to"}
        return LLMTimeout(f"timed out {stage.get(name, 'waiting for')} {where} ({name})", model=model)
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return LLMBadResponse(f"cannot build a request to {where}: {exc} (check the base_url)", model=model)
    if isinstance(exc, httpx.DecodingError | httpx.TooManyRedirects):
        return LLMBadResponse(f"{where} sent an answer that cannot be read ({name}: {exc})", model=model)
    if isinstance(exc, httpx.ConnectError):
        return LLMUnavailable(
            f"cannot reach {where}: is it running and is the base_url right? ({exc})", model=model
        )
    if isinstance(exc, httpx.TransportError):
        return LLMUnavailable(f"the connection to {where} failed ({name}: {exc})", model=model)
    if isinstance(exc, httpx.HTTPStatusError):
        response = exc.response
        return status_error(
            response.status_code, response.headers, response.text, model=model, provider=provider, where=where
        )
    if isinstance(exc, httpx.RequestError):
        return LLMUnavailable(f"the request to {where} failed ({name}: {exc})", model=model)
    return LLMBadResponse(f"talking to {where} failed unexpectedly ({name}: {exc})", model=model)
