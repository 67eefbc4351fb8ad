"""Reading one model's answer: its body within the size and idle limits, its JSON, and what a redirect,
an error sent as an answer or an unreadable field in it means.

Pure of retries and failover (the client decides those by the error's type), and of streaming
(streaming.py, which reads its events with :class:`Quiet` and :func:`readable` from here).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

import httpx

from bot.capped import read_at_most
from bot.catalog import ModelInfo
from bot.config import ProviderSettings
from bot.errors import LLMBadResponse, LLMError, LLMTimeout
from bot.llm import anthropic, openai
from bot.llm.failures import Provider, error_fields, named_status, status_error
from bot.llm.limits import MAX_BODY_BYTES, MiB, answer_too_large
from bot.llm.types import ChatResponse

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Target:
    """Everything needed to reach one model."""

    model: str
    provider: Provider
    info: ModelInfo
    settings: ProviderSettings
    where: str  # the server, as the user should read it in an error


class Quiet(Generic[T]):
    """The chunks of an answer that has started; a silence longer than ``idle`` seconds is LLMTimeout
    (``None``: no limit, until the reader sets one).

    A plain iterator class rather than a generator, so nothing is left suspended when the reader
    stops early (the response is closed by its owner).
    """

    def __init__(self, chunks: AsyncIterator[T], idle: float | None, target: Target) -> None:
        self._chunks = chunks
        self.idle = idle
        self._target = target

    def __aiter__(self) -> Quiet[T]:
        return self

    async def __anext__(self) -> T:
        try:
            async with asyncio.timeout(self.idle) as window:
                return await anext(self._chunks)
        except TimeoutError:
            if not window.expired():
                raise
            raise LLMTimeout(
                f"{self._target.where} went silent for {self.idle:g} s in the middle of an answer "
                "(llm.idle_timeout)",
                model=self._target.model,
            ) from None


async def read_body(target: Target, response: httpx.Response, idle: float) -> bytes:
    """The whole body, each chunk within ``idle`` seconds; past ``MAX_BODY_BYTES`` (limits.py)
    reading stops with LLMBadResponse, and the caller's ``aclose`` drops the connection."""
    body = await read_at_most(Quiet(response.aiter_bytes(), idle, target), MAX_BODY_BYTES)
    if body is None:
        raise too_large(target, f"a body over {MAX_BODY_BYTES // MiB} MiB")
    return body


async def read_whole(target: Target, response: httpx.Response, idle: float, seconds: float) -> bytes:
    """:func:`read_body` for a whole answer that came where a stream was asked for (an error, or the
    answer of a server that ignores ``stream``), all of it within ``seconds`` (``llm.timeout``, as any
    whole answer). A byte now and then keeps every read within ``idle``: without this bound only the
    turn's deadline ended such a body, and each retry of a 5xx took as long again."""
    async with within(seconds, target, f"did not send its whole answer within {seconds:g} s (llm.timeout)"):
        return await read_body(target, response, idle)


@contextlib.asynccontextmanager
async def within(seconds: float, target: Target, said: str) -> AsyncIterator[None]:
    """A bound on all of a step (httpx's timeouts are per read, so a trickle passes them): past
    ``seconds`` the step is LLMTimeout, "<server> ``said``". A timeout raised inside (an idle limit's
    own LLMTimeout) goes through as it is."""
    try:
        async with asyncio.timeout(seconds) as window:
            yield
    except TimeoutError:
        if not window.expired():
            raise
        raise LLMTimeout(f"{target.where} {said}", model=target.model) from None


def parse(target: Target, content: bytes) -> ChatResponse:
    """A whole answer's body as the provider's translator reads it; malformed JSON, an error body sent
    with HTTP 200 and fields of the wrong type are errors of the server (see :func:`readable`)."""
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, nested too deeply
        raise _not_json(target, content) from None
    if isinstance(body, dict) and "error" in body and "choices" not in body and "content" not in body:
        raise _error_in_200(target, content)
    translate = anthropic.parse_response if target.provider == "anthropic" else openai.parse_response
    with readable(target):
        return translate(body, target.model, target.where)


def _not_json(target: Target, content: bytes) -> LLMBadResponse:
    """An answer that is not JSON. A web page (an HTML document: a chat UI's address in place of its
    API's, a proxy's login or error page) says the base URL is wrong, and the error says so."""
    if content.lstrip()[:1] != b"<":
        return LLMBadResponse(
            f"{target.where} answered with malformed JSON for {target.model}", model=target.model
        )
    base = f"MEMBOT_LLM__{target.provider.upper()}__BASE_URL"
    return LLMBadResponse(
        f"{target.where} answered the request for {target.model} with a web page (HTML), not the API's "
        f"JSON: check that {base} is the API's address (OpenAI-compatible servers usually end in /v1), "
        "not a chat UI's, and that no proxy in between answers in its place",
        model=target.model,
    )


def redirected(target: Target, response: httpx.Response) -> LLMError:
    """A redirect is not followed (a POST with a key must not go elsewhere unasked): the operator is told
    where it leads, which is usually the base URL they meant (https, or a missing /v1)."""
    location = response.headers.get("location") or "nowhere it said"
    return LLMBadResponse(
        f"{target.where} redirected the request for {target.model} (HTTP {response.status_code}) to "
        f"{location}: if that is the server, set MEMBOT_LLM__{target.provider.upper()}__BASE_URL to it",
        model=target.model,
        status_code=response.status_code,
    )


def _error_in_200(target: Target, content: bytes) -> LLMError:
    """An error body sent with HTTP 200 (proxies such as OpenRouter do): classified by the status it
    names (``code``), else by its type, like the same error sent with its status; its message kept."""
    text = content.decode("utf-8", "replace")
    kind, code, _ = error_fields(text)
    status = named_status(kind, code)
    return status_error(status, {}, text, model=target.model, provider=target.provider, where=target.where)


@contextlib.contextmanager
def readable(target: Target) -> Iterator[None]:
    """A field of the wrong type in an answer ("n/a" for a count, a string where an object belongs) is
    the server's fault, like malformed JSON: :class:`LLMBadResponse`, so the next fallback model is
    asked and the user is told the model's answer could not be used, never a crash of the turn."""
    try:
        yield
    except LLMError:
        raise
    except (ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        raise LLMBadResponse(
            f"{target.where} sent an answer for {target.model} that could not be read "
            f"({type(exc).__name__}: {str(exc)[:200]})",
            model=target.model,
        ) from None


def error_answer(target: Target, response: httpx.Response, text: str) -> LLMError:
    """The error an HTTP error answer (status 400 and up) means (failures.py)."""
    return status_error(
        response.status_code,
        response.headers,
        text,
        model=target.model,
        provider=target.provider,
        where=target.where,
    )


def too_large(target: Target, what: str) -> LLMBadResponse:
    """The error for an answer past a limit of limits.py; ``what`` says which."""
    return answer_too_large(what, model=target.model, provider=target.provider, where=target.where)
