"""The model's HTTP client (bot/llm/transport.py): aiohttp underneath, httpx's errors on top, as
httpcore names them, against real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from bot.llm import llm_http_client

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def serve(handler: Handler) -> tuple[asyncio.Server, str]:
    async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(closing, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with await asyncio.to_thread(llm_http_client, httpx.Timeout(5.0, read=0.3)) as http:
        yield http


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_refused_connection_is_a_connect_error_not_a_timeout(client: httpx.AsyncClient) -> None:
    with pytest.raises(httpx.ConnectError) as caught:
        await client.get(f"http://127.0.0.1:{closed_port()}/v1/models")
    assert not isinstance(caught.value, httpx.TimeoutException)


async def test_a_server_that_hangs_up_is_a_protocol_error(client: httpx.AsyncClient) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")

    server, url = await serve(hang_up)
    async with server:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(url)


async def test_a_silent_server_is_a_read_timeout(client: httpx.AsyncClient) -> None:
    over = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")  # then nothing
        await writer.drain()
        await over.wait()

    server, url = await serve(silent)
    async with server:
        with pytest.raises(httpx.ReadTimeout):
            await client.get(url)
        over.set()
        await asyncio.sleep(0.05)  # (the handler closes its end)


async def test_credentials_in_the_url_are_sent_as_basic_auth(client: httpx.AsyncClient) -> None:
    seen: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()

    server, url = await serve(record)
    async with server:
        response = await client.get(url.replace("http://", "http://bob:s3cret@") + "/v1")
    assert response.status_code == 204
    assert (
        b"Authorization: Basic Ym9iOnMzY3JldA==" in seen[0]
        or b"authorization: Basic Ym9iOnMzY3JldA==" in seen[0]
    )
    assert b"s3cret" not in seen[0].split(b"\r\n")[0]  # not in the request line


async def test_a_response_read_and_closed_is_freed_without_the_cycle_collector(
    client: httpx.AsyncClient,
) -> None:
    """httpx's BoundAsyncStream points back at its response; closed, the response must not be in that
    cycle any more, or every request's objects wait for the cyclic GC (issue 19)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    server, url = await serve(answer)
    async with server:
        # Both ways the model client reads: whole, and streamed then closed.
        whole = await client.get(url)
        async with client.stream("GET", url) as streamed:
            assert await streamed.aread() == b"ok"
    assert whole.text == "ok" and whole.elapsed.total_seconds() > 0
    refs = [weakref.ref(whole), weakref.ref(streamed)]
    gc.disable()
    try:
        del whole, streamed
        assert [ref() for ref in refs] == [None, None]  # freed by reference counting alone
    finally:
        gc.enable()


async def test_a_proxy_in_the_environment_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lines.append((await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")[0])
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()

    server, url = await serve(proxy)
    monkeypatch.setenv("HTTP_PROXY", url)
    async with server, await asyncio.to_thread(llm_http_client) as http:
        response = await http.get("http://model.example/v1/models")
    assert response.status_code == 204
    assert lines == [b"GET http://model.example/v1/models HTTP/1.1"]
