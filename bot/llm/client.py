"""The LLM client: I/O, retries, failover and usage over an injected ``httpx.AsyncClient``.

Wire formats live in openai.py and anthropic.py; this module is the only place httpx errors are caught
and mapped to membot's own (see bot/errors.py), so callers decide by type, never by message text.

Retry: 408, 409, 429, 5xx and 529 (and timeouts and connection failures) are tried again with
exponential backoff and jitter, honouring ``retry-after-ms`` / ``retry-after`` up to a cap. Auth errors,
exhausted spend limits, context overflows and malformed answers are not retried. When a model's retries
are exhausted, the next model of the failover chain (``llm.fallback_models``) is tried.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import httpx
import structlog

from bot.catalog import ModelCatalog, ModelInfo
from bot.config import LLMSettings
from bot.domain import Usage
from bot.errors import (
    LLMAuthError,
    LLMBadResponse,
    LLMContextOverflow,
    LLMError,
    LLMRateLimited,
    LLMTimeout,
    LLMUnavailable,
)
from bot.llm import anthropic, openai
from bot.llm.sse import SSEvent, iter_sse
from bot.llm.types import ChatRequest, ChatResponse, StreamEvent

log = structlog.get_logger(__name__)

Provider = Literal["openai", "anthropic"]
_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
_SPEND_WORDS = ("insufficient_quota", "billing", "spend limit", "credit balance", "quota exceeded")
_OVERFLOW_WORDS = (
    "context_length_exceeded",
    "maximum context length",
    "prompt is too long",
    "context window",
)


class _Decoder(Protocol):
    done: bool

    def feed(self, event: SSEvent) -> list[StreamEvent]: ...

    def finish(self) -> ChatResponse: ...


@dataclass
class LLMStats:
    """Counters read by /status, /healthz and /metrics."""

    calls: int = 0
    failures: int = 0
    retries: int = 0
    failovers: int = 0
    last_ok: bool | None = None
    last_error: str | None = None
    last_call_at: datetime | None = None
    by_model: dict[str, Usage] = field(default_factory=dict)


class LLMClient:
    """Chat with the configured model (and its fallbacks) over OpenAI-compatible or Anthropic APIs.

    ``request.model=None`` means the configured primary model, then the fallbacks; a named model is
    used alone. ``sleep`` and ``rng`` are injectable so tests need not wait for backoff.
    """

    def __init__(
        self,
        settings: LLMSettings,
        catalog: ModelCatalog,
        http: httpx.AsyncClient,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._settings = settings
        self._catalog = catalog
        self._http = http
        self._sleep = sleep
        self._rng = rng
        self.stats = LLMStats()

    # -- public -----------------------------------------------------------------------------------

    @property
    def model(self) -> str:
        return self._settings.model

    def info(self, model: str | None = None) -> ModelInfo:
        model = model or self._settings.model
        return self._catalog.get(model, self.provider_of(model))

    def provider_of(self, model: str) -> Provider:
        if model == self._settings.model and self._settings.provider:
            return self._settings.provider
        return (
            self._catalog.get(model).provider
            if model in self._catalog
            else (self._settings.provider or "openai")
        )

    async def chat(self, request: ChatRequest) -> ChatResponse:
        last: LLMError | None = None
        chain = self._chain(request)
        for position, model in enumerate(chain):
            try:
                return await self._with_retries(model, request)
            except LLMError as exc:
                if not _fails_over(exc) or position == len(chain) - 1:
                    raise
                last = exc
                self.stats.failovers += 1
                log.warning("llm_failover", failed=model, next=chain[position + 1], error=str(exc))
        raise last or LLMUnavailable("no model configured")

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Yield text deltas as the model writes, then one ``done`` event with the whole response.

        Retries and failover happen only before the first delta; after that an error is raised, because
        the caller has already shown part of an answer.
        """
        chain = self._chain(request)
        for position, model in enumerate(chain):
            for attempt in range(self._settings.max_retries + 1):
                started = False
                try:
                    async for event in self._stream_once(model, request):
                        started = True
                        yield event
                    return
                except LLMError as exc:
                    self._failed(exc)
                    if started:
                        raise
                    if exc.retryable and attempt < self._settings.max_retries:
                        await self._backoff(attempt, exc)
                        continue
                    if _fails_over(exc) and position < len(chain) - 1:
                        self.stats.failovers += 1
                        break
                    raise

    # -- internals --------------------------------------------------------------------------------

    def _chain(self, request: ChatRequest) -> list[str]:
        if request.model:
            return [request.model]
        return [
            self._settings.model,
            *[m for m in self._settings.fallback_models if m != self._settings.model],
        ]

    async def _with_retries(self, model: str, request: ChatRequest) -> ChatResponse:
        for attempt in range(self._settings.max_retries + 1):
            try:
                response = await self._send_once(model, request)
            except LLMError as exc:
                self._failed(exc)
                if not exc.retryable or attempt == self._settings.max_retries:
                    raise
                await self._backoff(attempt, exc)
                continue
            self._succeeded(model, response)
            return response
        raise AssertionError("unreachable")

    async def _backoff(self, attempt: int, exc: LLMError) -> None:
        self.stats.retries += 1
        hinted = getattr(exc, "retry_after", None)
        if hinted is not None:
            delay = min(float(hinted), self._settings.retry_max_delay)
        else:
            base = self._settings.retry_base_delay * (2**attempt)
            delay = min(base * (0.5 + self._rng()), self._settings.retry_max_delay)
        log.info("llm_retry", attempt=attempt + 1, delay=round(delay, 3), error=str(exc))
        await self._sleep(delay)

    def _build(self, model: str, request: ChatRequest, *, stream: bool) -> tuple[httpx.Request, Provider]:
        provider = self.provider_of(model)
        info = self._catalog.get(model, provider)
        settings = self._settings.anthropic if provider == "anthropic" else self._settings.openai
        key = settings.api_key.get_secret_value() if settings.api_key else None
        max_tokens = min(
            request.max_output_tokens or self._settings.max_output_tokens, info.max_output_tokens
        )
        temperature = request.temperature if request.temperature is not None else self._settings.temperature
        translator = anthropic if provider == "anthropic" else openai
        http_request = translator.build_request(
            request,
            model=info,
            base_url=settings.base_url,
            api_key=key,
            max_tokens=max_tokens,
            temperature=temperature,
            timeout=request.timeout or self._settings.timeout,
            stream=stream,
        )
        return http_request, provider

    async def _send_once(self, model: str, request: ChatRequest) -> ChatResponse:
        http_request, provider = self._build(model, request, stream=False)
        try:
            response = await self._http.send(http_request)
        except httpx.HTTPError as exc:
            raise _transport_error(exc, model) from exc
        if response.status_code >= 400:
            raise _status_error(response.status_code, response.headers, response.text, model, provider)
        try:
            body = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise LLMBadResponse(f"{model}: the server answered with malformed JSON", model=model) from None
        if provider == "anthropic":
            return anthropic.parse_response(body, model)
        return openai.parse_response(body, model)

    async def _stream_once(self, model: str, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        http_request, provider = self._build(model, request, stream=True)
        decoder: _Decoder = (
            anthropic.StreamDecoder(model) if provider == "anthropic" else openai.StreamDecoder(model)
        )
        try:
            response = await self._http.send(http_request, stream=True)
        except httpx.HTTPError as exc:
            raise _transport_error(exc, model) from exc
        try:
            if response.status_code >= 400:
                text = (await response.aread()).decode("utf-8", "replace")
                raise _status_error(response.status_code, response.headers, text, model, provider)
            async for event in iter_sse(response.aiter_lines()):
                for item in decoder.feed(event):
                    yield item
                if decoder.done:
                    break
            if not decoder.done:
                raise LLMUnavailable(f"{model}: the stream ended before the answer was complete", model=model)
        except httpx.HTTPError as exc:
            raise _transport_error(exc, model) from exc
        finally:
            await response.aclose()
        final = decoder.finish()
        self._succeeded(model, final)
        yield StreamEvent("done", response=final)

    def _succeeded(self, model: str, response: ChatResponse) -> None:
        info = self._catalog.get(model, self.provider_of(model))
        response.usage.cost_usd = info.cost(response.usage)
        response.model = response.model or model
        self.stats.calls += 1
        self.stats.last_ok = True
        self.stats.last_error = None
        self.stats.last_call_at = datetime.now(UTC)
        self.stats.by_model.setdefault(model, Usage()).add(response.usage)

    def _failed(self, exc: LLMError) -> None:
        self.stats.failures += 1
        self.stats.last_ok = False
        self.stats.last_error = f"{type(exc).__name__}: {exc}"
        self.stats.last_call_at = datetime.now(UTC)


def _fails_over(exc: LLMError) -> bool:
    return isinstance(exc, LLMUnavailable | LLMTimeout | LLMRateLimited)


def _transport_error(exc: httpx.HTTPError, model: str) -> LLMError:
    """Every httpx error, mapped (tests prove the map is total)."""
    if isinstance(exc, httpx.TimeoutException):
        return LLMTimeout(f"{model}: the model server did not answer in time", model=model)
    if isinstance(exc, httpx.TransportError):
        return LLMUnavailable(f"{model}: cannot reach the model server ({type(exc).__name__})", model=model)
    if isinstance(exc, httpx.HTTPStatusError):
        return LLMUnavailable(f"{model}: HTTP {exc.response.status_code}", model=model)
    return LLMUnavailable(f"{model}: request failed ({type(exc).__name__})", model=model)


def retry_after_seconds(headers: httpx.Headers, now: float | None = None) -> float | None:
    """``retry-after-ms`` first, then ``retry-after`` as seconds (maybe fractional) or an HTTP date."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
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
    return max(0.0, when.timestamp() - (now if now is not None else time.time()))


def _status_error(status: int, headers: httpx.Headers, text: str, model: str, provider: Provider) -> LLMError:
    detail = _error_message(text)
    lowered = (text or "").lower()
    key_setting = f"MEMBOT_LLM__{provider.upper()}__API_KEY"
    where = "Anthropic" if provider == "anthropic" else "the OpenAI-compatible server"
    if status in (401, 403):
        return LLMAuthError(
            f"{where} rejected the API key for {model}: check {key_setting} ({detail})",
            model=model,
            status_code=status,
        )
    if any(word in lowered for word in _SPEND_WORDS):
        return LLMAuthError(
            f"{where}: quota or spend limit exhausted for {model} ({detail})", model=model, status_code=status
        )
    if status == 429:
        return LLMRateLimited(
            f"{model}: rate limited ({detail})",
            retry_after=retry_after_seconds(headers),
            model=model,
            status_code=status,
        )
    if status in _RETRY_STATUS or status >= 500:
        return LLMUnavailable(
            f"{model}: the provider is unavailable (HTTP {status}: {detail})",
            retry_after=retry_after_seconds(headers),
            model=model,
            status_code=status,
        )
    if any(word in lowered for word in _OVERFLOW_WORDS):
        return LLMContextOverflow(
            f"{model}: the conversation is longer than the model's window ({detail})",
            model=model,
            status_code=status,
        )
    if status == 404:
        return LLMBadResponse(
            f"{where} does not know model {model!r} (HTTP 404): check MEMBOT_LLM__MODEL",
            model=model,
            status_code=status,
        )
    return LLMBadResponse(
        f"{model}: the provider refused the request (HTTP {status}: {detail})",
        model=model,
        status_code=status,
    )


def _error_message(text: str) -> str:
    try:
        body: Any = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return (text or "").strip()[:200] or "no details"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return str(error.get("message") or error.get("type") or error)[:300]
        if isinstance(error, str):
            return error[:300]
        if "message" in body:
            return str(body["message"])[:300]
    return str(body)[:200]
