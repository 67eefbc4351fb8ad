"""How the fakes' file servers (Telegram's file host, Discord's CDN) send a file body, misbehaving when
asked: gzip-encoded whatever the client accepts, chunked without ``Content-Length``, dripped a byte at
a time, over and over, never ending (a body no read timeout catches), or held back until the test lets
it go (a slow server, without a clock in the test)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
from collections.abc import Callable

from aiohttp import web

CHUNK = 64 * 1024


async def send_body(
    request: web.Request,
    data: bytes,
    *,
    gzipped: bool = False,
    chunked: bool = False,
    drip: float = 0.0,
    held: asyncio.Event | None = None,
    sent: Callable[[int], None] = lambda n: None,
) -> web.StreamResponse:
    """Write ``data`` in pieces, telling ``sent`` each piece's size, until done or the client hung up;
    with ``held``, the headers go out at once and the body only once the event is set."""
    body = gzip.compress(data) if gzipped else data
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    if gzipped:
        response.headers["Content-Encoding"] = "gzip"
    if not chunked and not drip:
        response.content_length = len(body)
    await response.prepare(request)
    if held is not None:
        await held.wait()
    with contextlib.suppress(ConnectionError):
        if drip:
            for byte in itertools.cycle(body):
                await response.write(bytes([byte]))
                sent(1)
                await asyncio.sleep(drip)
            return response
        for start in range(0, len(body), CHUNK):
            piece = body[start : start + CHUNK]
            await response.write(piece)
            sent(len(piece))
        await response.write_eof()
    return response
