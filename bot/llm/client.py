"""The LLM client: I/O, retries, failover and usage over an injected ``httpx.AsyncClient``.

Wire formats live in openai.py and anthropic.py (pure translators); what an error answer means lives in
failures.py; base URLs are checked and shown in endpoints.py. Every httpx call here runs inside
``httpx_errors`` (httpx_errors.py), the one place httpx exceptions become membot's own (bot/errors.py).

One call, step by step:

1. The failover chain: ``request.model`` alone, or ``llm.model`` then ``llm.fallback_models``.
2. Per model: the provider (``llm.provider`` for the primary, else the catalog), its key and base URL.
3. Send. 408, 409, 429, 5xx, 529, timeouts and connection failures are retried (``retryable`` errors)
   up to ``llm.max_retries`` times with exponential backoff and jitter, or after the server's
   ``retry-after-ms`` / ``retry-after``, never longer than ``llm.retry_max_delay``. A timeout is
   retried once only: a server that stayed silent twice is hung, and every further try would keep
   the user waiting as long again. An answer larger than any model writes (a body over 32 MiB, a
   stream past 8 Mi characters or 10,000 tool calls, one line or event of it over 32 Mi characters:
   limits.py) is a bad response, its connection closed.

   Time limits of one try: a non-streamed answer must be complete within ``llm.timeout`` (its first
   byte comes only when the model has written all of it); a streamed one must start within
   ``llm.first_byte_timeout``; and once bytes flow, a silence longer than ``llm.idle_timeout`` ends
   the try. So a hung server costs seconds, not the minutes a plain read timeout times the retries did.
4. Retries exhausted on a retryable error: the next model of the chain. Auth and spend-limit errors,
   an unknown model and malformed answers are not tried again on the same model, since another try
   cannot help there, but the next model of the chain is tried (another provider, another key, a model
   the server has). A context overflow is raised at once: compaction, not another model, makes room.
5. Success: each tool call gets an id no other call of the conversation has (call_ids.py); usage
   and cost (from the catalog) are added to :class:`LLMStats` and reported, with the request's
   ``purpose``, to the ``usage`` observer (the daily ledger), so every call is counted: chat turns,
   compaction summaries and memory consolidation alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import httpx
import structlog

from bot.catalog import ModelCatalog, ModelInfo
from bot.config import LLMSettings, ProviderSettings
from bot.domain import Usage
from bot.errors import LLMAuthError, LLMBadResponse, LLMContextOverflow, LLMError, LLMTimeout, LLMUnavailable
from bot.llm import anthropic, openai
from bot.llm.call_ids import made_unique
from bot.llm.endpoints import check_base_url, where
from bot.llm.failures import STATUS_OF_TYPE, Provider, key_setting, status_error
from bot.llm.httpx_errors import HTTPX_ERRORS, httpx_errors, map_httpx_error
from bot.llm.limits import (
    MAX_BODY_BYTES,
    MAX_STREAMED_CALLS,
    MAX_STREAMED_CHARS,
    MiB,
    answer_too_large,
    read_at_most,
)
from bot.llm.sse import SSETooLarge, SSEvent, iter_lines, iter_sse
from bot.llm.stats import LLMStats
from bot.llm.types import ChatRequest, ChatResponse, StreamEvent, Wire
from bot.retry import Backoff, retry

__all__ = ["HTTPX_ERRORS", "LLMClient", "LLMStats", "UsageObserver", "map_httpx_error"]

log = structlog.get_logger(__name__)

T = TypeVar("T")


class _Decoder(Protocol):
    done: bool
    size: int

    @property
    def calls(self) -> int: ...

    @property
    def complete(self) -> bool: ...

    def feed(self, event: SSEvent) -> list[StreamEvent]: ...

    def finish(self) -> ChatResponse: ...


class UsageObserver(Protocol):
    """Told about every successful call (bot.usage.UsageLedger is one)."""

    async def record(self, purpose: str, model: str, usage: Usage) -> None: ...


@dataclass(frozen=True, slots=True)
class _Target:
    """Everything needed to reach one model."""

    model: str
    provider: Provider
    info: ModelInfo
    settings: ProviderSettings
    where: str  # the server, as the user should read it in an error


class LLMClient:
    """Chat with the configured model (and its fallbacks) over the OpenAI-compatible or Anthropic API.

    Usage::

        async with httpx.AsyncClient() as http:
            llm = LLMClient(settings.llm, catalog, http)
            reply = await llm.chat(ChatRequest(messages=(Message(Role.USER, "hi"),)))
            async for event in llm.stream(request):  # "text" / "tool_call" deltas, then "done"
                ...

    The HTTP client belongs to the caller (the composition root), so this class owns nothing to close.
    ``usage`` is told every successful call's usage and purpose. ``sleep`` and ``rng`` are injectable
    so tests can check backoff without waiting for it. Errors are always bot.errors LLM types;
    ``stats`` is read by the ops endpoints.
    """

    def __init__(
        self,
        settings: LLMSettings,
        catalog: ModelCatalog,
        http: httpx.AsyncClient,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
        usage: UsageObserver | None = None,
    ) -> None:
        for name, section in (("openai", settings.openai), ("anthropic", settings.anthropic)):
            check_base_url(name, section.base_url)
        # How errors name each server: fixed by the settings, and parsing a URL on every call adds up.
        self._where: dict[Provider, str] = {
            "openai": where("openai", settings.openai),
            "anthropic": where("anthropic", settings.anthropic),
        }
        self._settings = settings
        self._catalog = catalog
        self._http = http
        self._sleep = sleep
        self._rng = rng
        self._usage = usage
        self.stats = LLMStats()

    @property
    def model(self) -> str:
        """The configured primary model."""
        return self._settings.model

    def info(self, model: str | None = None) -> ModelInfo:
        """Catalog facts (window, prices, abilities) for ``model``, default the primary."""
        model = model or self._settings.model
        return self._catalog.get(model, self.provider_of(model))

    def provider_of(self, model: str) -> Provider:
        """``llm.provider`` for the primary when set; else the catalog's; unknown models speak OpenAI."""
        if model == self._settings.model and self._settings.provider:
            return self._settings.provider
        if model in self._catalog:
            return self._catalog.get(model).provider
        return self._settings.provider or "openai"

    async def chat(self, request: ChatRequest) -> ChatResponse:
        """One complete answer, with retries and failover (see the module docstring)."""
        chain = self._chain(request)
        for position, model in enumerate(chain):
            try:
                return await self._with_retries(model, request)
            except LLMError as exc:
                if isinstance(exc, LLMContextOverflow) or position == len(chain) - 1:
                    raise
                self._failover(model, chain[position + 1], exc)
        raise AssertionError("the chain is never empty")

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Yield ``text`` and ``tool_call`` deltas as the model writes, then one ``done`` event.

        The ``done`` event carries the whole ChatResponse (text, tool calls, usage). Retries and
        failover happen only before the first delta; after it an error is raised as is, because the
        caller has already shown part of an answer.
        """
        chain = self._chain(request)
        for position, model in enumerate(chain):
            for attempt in range(self._settings.max_retries + 1):
                started = False
                try:
                    async with aclosing(self._stream_once(model, request)) as events:
                        async for event in events:
                            started = True
                            yield event
                    return
                except LLMError as exc:
                    self._failed(model, exc)
                    if started or isinstance(exc, LLMContextOverflow):
                        raise
                    if exc.retryable and self._may_retry(exc, attempt):
                        await self._backoff(attempt, exc)
                        continue
                    if position == len(chain) - 1:
                        raise
                    self._failover(model, chain[position + 1], exc)
                    break

    # -- one model ----------------------------------------------------------------------------------

    def _chain(self, request: ChatRequest) -> list[str]:
        if request.model:
            return [request.model]
        primary = self._settings.model
        return [primary, *dict.fromkeys(m for m in self._settings.fallback_models if m != primary)]

    def _may_retry(self, exc: LLMError, attempt: int) -> bool:
        """Whether try ``attempt`` (0-based) may be followed by another on the same model."""
        limit = self._settings.max_retries
        if isinstance(exc, LLMTimeout):
            limit = min(limit, 1)
        return exc.retryable and attempt < limit

    async def _with_retries(self, model: str, request: ChatRequest) -> ChatResponse:
        async def once() -> tuple[ChatResponse, float]:
            started = time.monotonic()
            try:
                return await self._send_once(model, request), time.monotonic() - started
            except LLMError as exc:
                self._failed(model, exc)
                raise

        response, elapsed = await retry(
            once,
            retry_if=lambda exc, tries: isinstance(exc, LLMError) and self._may_retry(exc, tries - 1),
            wait=self._delay,
            on_retry=self._retrying,
            sleep=self._sleep,
        )
        await self._succeeded(model, request, response, elapsed)
        return response

    async def _backoff(self, attempt: int, exc: LLMError) -> None:
        """Wait before try ``attempt + 1`` (the streaming loop's own retry; see :meth:`_with_retries`)."""
        delay = self._delay(exc, attempt + 1)
        self._retrying(exc, attempt + 1, delay)
        await self._sleep(delay)

    def _delay(self, exc: Exception, tries: int) -> float:
        """The server's hint if it gave one, else exponential with jitter; never above the cap."""
        backoff = Backoff(self._settings.retry_base_delay, self._settings.retry_max_delay, jitter=self._rng)
        return backoff(tries - 1, hint=getattr(exc, "retry_after", None))

    def _retrying(self, exc: Exception, tries: int, delay: float) -> None:
        self.stats.retries += 1
        model = getattr(exc, "model", None)
        log.info("llm_retry", model=model, attempt=tries, delay=round(delay, 3), error=str(exc))

    def _failover(self, failed: str, following: str, exc: LLMError) -> None:
        self.stats.failovers += 1
        log.warning("llm_failover", failed=failed, next=following, error=str(exc))

    def _target(self, model: str) -> _Target:
        provider = self.provider_of(model)
        settings = self._settings.anthropic if provider == "anthropic" else self._settings.openai
        return _Target(model, provider, self._catalog.get(model, provider), settings, self._where[provider])

    def _build(self, target: _Target, request: ChatRequest, *, stream: bool) -> httpx.Request:
        key = target.settings.api_key.get_secret_value() if target.settings.api_key else None
        if key is None and (target.provider == "anthropic" or openai.is_official(target.settings.base_url)):
            raise LLMAuthError(
                f"{target.where} needs an API key for {target.model}: set {key_setting(target.provider)}",
                model=target.model,
            )
        limit = request.max_output_tokens or self._settings.max_output_tokens
        temperature = request.temperature if request.temperature is not None else self._settings.temperature
        seconds = request.timeout or self._settings.timeout
        # Our own limits (whole answer, first byte, idle) decide; httpx's per-read one is only a backstop.
        backstop = max(seconds, self._settings.first_byte_timeout, self._settings.idle_timeout)
        build = anthropic.build_request if target.provider == "anthropic" else openai.build_request
        with _httpx_errors(target):
            wire = Wire(
                model=target.info,
                base_url=target.settings.base_url,
                api_key=key,
                max_tokens=min(limit, target.info.max_output_tokens),
                temperature=temperature,
                timeout=httpx.Timeout(backstop, connect=min(seconds, self._settings.connect_timeout)),
                stream=stream,
            )
            return build(request, wire)

    async def _send_once(self, model: str, request: ChatRequest) -> ChatResponse:
        target = self._target(model)
        http_request = self._build(target, request, stream=False)
        seconds = request.timeout or self._settings.timeout
        try:
            # httpx's timeouts are per read; this bounds the whole answer, so a trickle cannot hang a turn.
            async with asyncio.timeout(seconds):
                with _httpx_errors(target):
                    response = await self._http.send(http_request, stream=True)
                    try:
                        body = await self._read_body(target, response)
                    finally:
                        await response.aclose()
        except TimeoutError as exc:
            if isinstance(exc, LLMError):
                raise
            raise LLMTimeout(f"{target.where} did not answer within {seconds:g} s", model=model) from None
        if response.status_code >= 400:
            raise _error_answer(target, response, body.decode("utf-8", "replace"))
        if response.status_code >= 300:
            raise _redirected(target, response)
        return _unique_ids(target, request, _parse(target, body))

    async def _read_body(self, target: _Target, response: httpx.Response) -> bytes:
        """The whole body, each chunk within ``idle_timeout``; past ``MAX_BODY_BYTES`` (limits.py)
        reading stops with LLMBadResponse, and the caller's ``aclose`` drops the connection."""
        body = await read_at_most(
            _Quiet(response.aiter_bytes(), self._settings.idle_timeout, target), MAX_BODY_BYTES
        )
        if body is None:
            raise _too_large(target, f"a body over {MAX_BODY_BYTES // MiB} MiB")
        return body

    async def _open_stream(self, target: _Target, request: ChatRequest) -> httpx.Response:
        """Send a streaming request; the answer must start within ``first_byte_timeout``."""
        http_request = self._build(target, request, stream=True)
        seconds = min(self._settings.first_byte_timeout, request.timeout or float("inf"))
        try:
            async with asyncio.timeout(seconds) as window:
                with _httpx_errors(target):
                    return await self._http.send(http_request, stream=True)
        except TimeoutError:
            if not window.expired():
                raise
            raise LLMTimeout(
                f"{target.where} did not start answering within {seconds:g} s (llm.first_byte_timeout)",
                model=target.model,
            ) from None

    async def _stream_once(self, model: str, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        target = self._target(model)
        started = time.monotonic()
        response = await self._open_stream(target, request)
        try:
            with _httpx_errors(target):
                if response.status_code >= 400:
                    text = (await self._read_body(target, response)).decode("utf-8", "replace")
                    raise _error_answer(target, response, text)
                if response.status_code >= 300:
                    raise _redirected(target, response)
                if "text/event-stream" not in response.headers.get("content-type", ""):
                    # The server ignored stream=true (some compatible servers do): a whole answer.
                    final = _parse(target, await self._read_body(target, response))
                    for event in _replay(final):
                        yield event
                else:
                    decoder: _Decoder = (
                        anthropic.StreamDecoder(model, target.where)
                        if target.provider == "anthropic"
                        else openai.StreamDecoder(model, target.where)
                    )
                    lines = _Quiet(iter_lines(response.aiter_text()), self._settings.idle_timeout, target)
                    # Keep-alives (comments, pings) are bytes but no progress: they must not keep a
                    # hung answer open until the turn's deadline.
                    found = _events(iter_sse(lines), target)
                    async for sse in _Quiet(found, self._settings.idle_timeout, target):
                        with _readable(target):
                            events = list(decoder.feed(sse))
                        if decoder.size > MAX_STREAMED_CHARS:
                            raise _too_large(target, f"over {MAX_STREAMED_CHARS // MiB} Mi characters")
                        if decoder.calls > MAX_STREAMED_CALLS:
                            raise _too_large(target, f"over {MAX_STREAMED_CALLS} tool calls")
                        for event in events:
                            yield event
                        if decoder.done:
                            break
                    if not decoder.complete:
                        raise LLMUnavailable(
                            f"{target.where} ended the stream before the answer was complete", model=model
                        )
                    with _readable(target):
                        final = decoder.finish()
        finally:
            await response.aclose()
        final = _unique_ids(target, request, final)
        await self._succeeded(model, request, final, time.monotonic() - started)
        yield StreamEvent("done", response=final)

    async def _succeeded(
        self, model: str, request: ChatRequest, response: ChatResponse, latency: float
    ) -> None:
        response.usage.cost_usd = self.info(model).cost(response.usage)
        response.model = response.model or model
        self.stats.succeeded(model, response.usage, latency, request.purpose)
        if self._usage is not None:
            try:
                await self._usage.record(request.purpose, model, response.usage)
            except Exception:  # the answer is here and paid for; a bookkeeping hiccup must not cost it
                log.exception("usage_not_recorded", purpose=request.purpose, model=model)

    def _failed(self, model: str, exc: LLMError) -> None:
        self.stats.failed(model, exc)


class _Quiet(Generic[T]):
    """The chunks of an answer that has started; a silence longer than ``idle`` seconds is LLMTimeout.

    A plain iterator class rather than a generator, so nothing is left suspended when the reader
    stops early (the response is closed by its owner).
    """

    def __init__(self, chunks: AsyncIterator[T], idle: float, target: _Target) -> None:
        self._chunks = chunks
        self._idle = idle
        self._target = target

    def __aiter__(self) -> _Quiet[T]:
        return self

    async def __anext__(self) -> T:
        try:
            async with asyncio.timeout(self._idle) as window:
                return await anext(self._chunks)
        except TimeoutError:
            if not window.expired():
                raise
            raise LLMTimeout(
                f"{self._target.where} went silent for {self._idle:g} s in the middle of an answer "
                "(llm.idle_timeout)",
                model=self._target.model,
            ) from None


async def _events(events: AsyncIterator[SSEvent], target: _Target) -> AsyncIterator[SSEvent]:
    """The events that carry something (Anthropic's ``ping`` does not; comments never arrive here); a
    line or an event past its limit (limits.py) is an answer too large."""
    try:
        async for event in events:
            if event.event != "ping":
                yield event
    except SSETooLarge as exc:
        raise _too_large(target, str(exc)) from None


def _replay(final: ChatResponse) -> Iterator[StreamEvent]:
    if final.content:
        yield StreamEvent("text", text=final.content)
    for call in final.tool_calls:
        yield StreamEvent("tool_call", text=call.name)


def _parse(target: _Target, content: bytes) -> ChatResponse:
    try:
        body = json.loads(content)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        raise LLMBadResponse(
            f"{target.where} answered with malformed JSON for {target.model}", model=target.model
        ) from None
    if isinstance(body, dict) and "error" in body and "choices" not in body and "content" not in body:
        raise _error_in_200(target, body, content)
    parse = anthropic.parse_response if target.provider == "anthropic" else openai.parse_response
    with _readable(target):
        return parse(body, target.model, target.where)


def _redirected(target: _Target, response: httpx.Response) -> LLMError:
    """A redirect is not followed (a POST with a key must not go elsewhere unasked): the operator is told
    where it leads, which is usually the base URL they meant (https, or a missing /v1)."""
    location = response.headers.get("location") or "nowhere it said"
    return LLMBadResponse(
        f"{target.where} redirected the request for {target.model} (HTTP {response.status_code}) to "
        f"{location}: if that is the server, set MEMBOT_LLM__{target.provider.upper()}__BASE_URL to it",
        model=target.model,
        status_code=response.status_code,
    )


def _error_in_200(target: _Target, body: dict[str, object], content: bytes) -> LLMError:
    """An error body sent with HTTP 200 (proxies such as OpenRouter do): classified by the status it
    names (``code``), else by its type, like the same error sent with its status; its message kept."""
    error = body["error"]
    code = error.get("code") if isinstance(error, dict) else None
    kind = str(error.get("type") or "") if isinstance(error, dict) else ""
    status = int(code) if isinstance(code, int | str) and str(code).isdigit() else 0
    if not 400 <= status < 600:
        status = STATUS_OF_TYPE.get(kind, 500)
    text = content.decode("utf-8", "replace")
    return status_error(status, {}, text, model=target.model, provider=target.provider, where=target.where)


@contextlib.contextmanager
def _readable(target: _Target) -> Iterator[None]:
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


def _unique_ids(target: _Target, request: ChatRequest, response: ChatResponse) -> ChatResponse:
    prefix = "toolu_" if target.provider == "anthropic" else "call_"
    return made_unique(response, request, prefix, target.model)


def _error_answer(target: _Target, response: httpx.Response, text: str) -> LLMError:
    return status_error(
        response.status_code,
        response.headers,
        text,
        model=target.model,
        provider=target.provider,
        where=target.where,
    )


def _too_large(target: _Target, what: str) -> LLMBadResponse:
    return answer_too_large(what, model=target.model, provider=target.provider, where=target.where)


def _httpx_errors(target: _Target) -> contextlib.AbstractContextManager[None]:
    return httpx_errors(model=target.model, provider=target.provider, where=target.where)
