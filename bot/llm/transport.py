"""The model client's HTTP client: httpx's API over aiohttp's connection pool.

Why: under load, httpcore's pool checks every pooled connection (a ``getpeername`` and a ``select``
each) whenever it queues or finishes a request, and its anyio layers cost more per request than the
rest of a turn. ``python bench/concurrency.py`` (200 chats x 5 messages, memory off) measured 3.6-4.1
against 8.2-9.1 ms of CPU per message, and 262-282 against 118-133 messages/s. httpx stays the API
(requests, timeouts, the errors bot/llm/httpx_errors.py maps); httpx-aiohttp (the transport the OpenAI
SDK offers for the same reason) carries the requests, and aiohttp is a dependency already (the
webhook server, discord.py).

Its own error map names some failures wrongly (a refused connection becomes a ``ConnectTimeout``, a
server that hung up too), so each error is mapped again here from the aiohttp exception underneath,
as httpcore would have named it. With a proxy in the environment (``HTTPS_PROXY``, ``ALL_PROXY``...)
httpx's own transport is kept: it honours them, and an aiohttp transport would not.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Iterator

import httpx

_Errors = tuple[tuple[type[BaseException], type[httpx.TransportError]], ...]


@functools.cache
def _errors() -> _Errors:
    """aiohttp's errors as httpcore names them, most specific first (a connect timeout is also a
    ServerTimeoutError). Imported when first needed: ``import bot.app`` loads no aiohttp."""
    import aiohttp

    return (
        (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
        (aiohttp.ServerTimeoutError, httpx.ReadTimeout),
        (aiohttp.ClientConnectorError, httpx.ConnectError),
        (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
        (aiohttp.ClientPayloadError, httpx.RemoteProtocolError),
        (aiohttp.InvalidURL, httpx.UnsupportedProtocol),
        (aiohttp.ClientOSError, httpx.ReadError),
        (aiohttp.ClientError, httpx.TransportError),
    )


def llm_http_client(timeout: httpx.Timeout | None = None) -> httpx.AsyncClient:
    """The client the LLM (and embeddings) endpoints are reached with; the caller closes it.

    Its first call imports aiohttp: call it in a thread from async code."""
    import urllib.request  # (not at import: bot.app's importers need no proxy lookup)

    if any(urllib.request.getproxies().get(s) for s in ("http", "https", "all")):
        return httpx.AsyncClient(timeout=timeout)  # httpx's transport honours the proxy
    return httpx.AsyncClient(timeout=timeout, transport=_Transport())


class _Transport(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        from httpx_aiohttp import AiohttpTransport

        _errors()  # imported now, with the transport: not on the event loop at the first failure
        self._inner = AiohttpTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.userinfo:  # httpx made it the Authorization header; aiohttp refuses both at once
            request.url = request.url.copy_with(userinfo=b"")
        with _mapped(request):
            response = await self._inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        stream = _Stream(response.stream, request)
        stream.response = httpx.Response(
            response.status_code,
            headers=response.headers.raw,
            stream=stream,
            request=request,
            extensions=response.extensions,
        )
        return stream.response

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Stream(httpx.AsyncByteStream):
    """The response body, with aiohttp's errors mapped; once closed, it unbinds its response.

    httpx's client wraps every response's stream in a ``BoundAsyncStream`` that points back at the
    response (to set ``elapsed`` on close): a reference cycle, so each request's response, request,
    headers and aiohttp objects (about 40 objects) waited for the cyclic garbage collector instead of
    going when the turn let go of them. On close (``elapsed`` is set by then) the response is given this
    stream back in place of the wrapper, which breaks the cycle. Under load (``bench/concurrency.py``,
    200 chats x 5 messages, memory on) that was all the cyclic garbage a turn left.
    """

    def __init__(self, inner: httpx.AsyncByteStream, request: httpx.Request) -> None:
        self._inner = inner
        self._request = request
        self.response: httpx.Response | None = None  # set by the transport, let go of on close

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _mapped(self._request):
            async for chunk in self._inner:
                yield chunk

    async def aclose(self) -> None:
        try:
            with _mapped(self._request):
                await self._inner.aclose()
        finally:
            response, self.response = self.response, None
            if response is not None:
                response.stream = self  # in place of httpx's BoundAsyncStream: see the class doc


@contextlib.contextmanager
def _mapped(request: httpx.Request) -> Iterator[None]:
    """Re-raise an aiohttp failure (bare, or under httpx-aiohttp's own mapping) as httpcore names it."""
    errors = _errors()
    client_error = errors[-1][0]  # aiohttp.ClientError, the base of them all
    try:
        yield
    except (client_error, httpx.TransportError) as exc:
        cause = exc if isinstance(exc, client_error) else exc.__cause__
        for source, target in errors:
            if isinstance(cause, source):
                raise target(str(cause) or type(cause).__name__, request=request) from cause
        raise
