"""STYLE 10: every exception httpx can raise is mapped to a bot.errors LLM error, and the map is total.

A new exception class in an httpx upgrade fails ``test_every_httpx_exception_is_classified`` until it
is given a meaning here and in ``bot/llm/httpx_errors.py``.
"""

from __future__ import annotations

import inspect
from typing import Any

import httpx
import pytest

from bot.catalog import ModelCatalog
from bot.config import LLMSettings
from bot.domain import Message, Role
from bot.errors import LLMAuthError, LLMBadResponse, LLMError, LLMTimeout, LLMUnavailable
from bot.llm import ChatRequest, LLMClient
from bot.llm.httpx_errors import HTTPX_ERRORS, map_httpx_error

REQUEST = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")

EXPECTED: dict[type[Exception], type[LLMError]] = {
    httpx.HTTPError: LLMBadResponse,  # abstract base, never raised by httpx itself
    httpx.RequestError: LLMUnavailable,
    httpx.TransportError: LLMUnavailable,
    httpx.TimeoutException: LLMTimeout,
    httpx.ConnectTimeout: LLMTimeout,
    httpx.ReadTimeout: LLMTimeout,
    httpx.WriteTimeout: LLMTimeout,
    httpx.PoolTimeout: LLMTimeout,
    httpx.NetworkError: LLMUnavailable,
    httpx.ConnectError: LLMUnavailable,
    httpx.ReadError: LLMUnavailable,
    httpx.WriteError: LLMUnavailable,
    httpx.CloseError: LLMUnavailable,
    httpx.ProtocolError: LLMUnavailable,
    httpx.LocalProtocolError: LLMUnavailable,
    httpx.RemoteProtocolError: LLMUnavailable,
    httpx.ProxyError: LLMUnavailable,
    httpx.UnsupportedProtocol: LLMBadResponse,
    httpx.DecodingError: LLMBadResponse,
    httpx.TooManyRedirects: LLMBadResponse,
    httpx.HTTPStatusError: LLMUnavailable,  # built below with a 503 response
    httpx.InvalidURL: LLMBadResponse,
    httpx.CookieConflict: LLMBadResponse,
    httpx.StreamError: LLMBadResponse,
    httpx.StreamConsumed: LLMBadResponse,
    httpx.StreamClosed: LLMBadResponse,
    httpx.ResponseNotRead: LLMBadResponse,
    httpx.RequestNotRead: LLMBadResponse,
}


def httpx_exception_classes() -> list[type[Exception]]:
    found = {
        cls
        for module in (httpx, httpx._exceptions)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, Exception) and cls.__module__.startswith("httpx")
    }
    return sorted(found, key=lambda cls: cls.__name__)


def instance(cls: type[Exception]) -> Exception:
    if cls is httpx.HTTPStatusError:
        return httpx.HTTPStatusError("503", request=REQUEST, response=httpx.Response(503, request=REQUEST))
    try:
        return cls("boom")
    except TypeError:
        return cls()


def test_every_httpx_exception_is_classified() -> None:
    classes = httpx_exception_classes()
    assert len(classes) >= 25
    assert set(classes) == set(EXPECTED), "classify new httpx exceptions in EXPECTED and client.py"
    for cls in classes:
        assert issubclass(cls, HTTPX_ERRORS), f"{cls.__name__} would escape the client"


@pytest.mark.parametrize("cls", httpx_exception_classes(), ids=lambda cls: cls.__name__)
def test_each_exception_maps_to_its_llm_error(cls: type[Exception]) -> None:
    mapped = map_httpx_error(instance(cls), model="m", provider="openai", where="OpenAI")
    assert type(mapped) is EXPECTED[cls]
    assert mapped.model == "m" and str(mapped)


def test_a_status_error_maps_like_the_response() -> None:
    response = httpx.Response(401, request=REQUEST, json={"error": {"message": "bad key"}})
    error = httpx.HTTPStatusError("401", request=REQUEST, response=response)
    mapped = map_httpx_error(error, model="m", provider="anthropic", where="Anthropic")
    assert isinstance(mapped, LLMAuthError) and "MEMBOT_LLM__ANTHROPIC__API_KEY" in str(mapped)


@pytest.mark.parametrize("cls", httpx_exception_classes(), ids=lambda cls: cls.__name__)
async def test_the_client_raises_the_mapped_error_from_the_transport(
    cls: type[Exception], catalog: ModelCatalog
) -> None:
    """Whatever the transport raises comes out of ``chat`` as an LLM error, chained to the original."""
    raised = instance(cls)

    def handler(request: httpx.Request) -> httpx.Response:
        raise raised

    settings = LLMSettings.model_validate(
        {"model": "llama3.1", "openai": {"base_url": "http://127.0.0.1:1/v1"}, "max_retries": 0}
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        llm = LLMClient(settings, catalog, http)
        with pytest.raises(LLMError) as info:
            await llm.chat(ChatRequest(messages=(Message(Role.USER, "hi"),)))
    assert type(info.value) is EXPECTED[cls]
    assert info.value.__cause__ is raised


async def test_retryable_transport_errors_are_retried(catalog: ModelCatalog) -> None:
    calls: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(
            200, json={"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
        )

    async def no_wait(seconds: float) -> None:
        return None

    settings = LLMSettings.model_validate(
        {"model": "llama3.1", "openai": {"base_url": "http://127.0.0.1:1/v1"}}
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        response = await LLMClient(settings, catalog, http, sleep=no_wait).chat(
            ChatRequest(messages=(Message(Role.USER, "hi"),))
        )
    assert response.content == "ok" and len(calls) == 2
