"""The LLM client: I/O, retries, failover and usage over an injected ``httpx.AsyncClient``.

Wire formats live in openai.py and anthropic.py (pure translators); what an error answer means lives in
failures.py; base URLs are checked and shown in endpoints.py. Reading an answer (its body, JSON, a
redirect) is answer.py, reading a streamed one streaming.py; which models to ask, and whether and when
to try again, is retry_policy.py. This module sends, times and retries. Every httpx call here runs
inside ``httpx_errors`` (httpx_errors.py), the one place httpx exceptions become membot's own
(bot/errors.py).

One call, step by step:

1. The failover chain: ``request.model`` alone, or ``llm.model`` then ``llm.fallback_models``. A model
   of a longer chain that failed with an outage (5xx, a timeout, no connection) on two calls in a row
   is asked last, after the others, for 30 s (doubling to 5 min while it keeps failing; one call tries
   it when each cool-down ends, and its first success ends that): the circuit breaker, breaker.py
   (``llm_model_skipped`` / ``llm_model_back`` in the log). A single model is always asked first.
2. Per model: the provider (``llm.provider`` for the primary, else the catalog), its key and base URL.
3. Send. 408, 409, 429, 5xx, 529, timeouts and connection failures are retried (``retryable`` errors)
   up to ``llm.max_retries`` times with exponential backoff and jitter, or after the server's
   ``retry-after-ms`` / ``retry-after``, never longer than ``llm.retry_max_delay``. A server that asks
   for a longer wait than that is not tried again before it: such a try would only be refused again
   (and count against the rate limit), so the next model is asked, and after the last one the turn
   waits for the model as long as the server said (bot/model_wait.py). A timeout is
   retried once only: a server that stayed silent twice is hung, and every further try would keep
   the user waiting as long again. An answer larger than any model writes (a body over 32 MiB, a
   stream past 8 Mi characters or 10,000 tool calls, one line or event of it over 32 Mi characters:
   limits.py) is a bad response, its connection closed.

   Time limits of one try: a non-streamed answer must be complete within ``llm.timeout`` (its first
   byte comes only when the model has written all of it); a streamed one must start within
   ``llm.first_byte_timeout`` (a whole body sent instead, an error or the answer of a server that
   ignores ``stream``, must then be complete within ``llm.timeout``); and once bytes flow, a silence
   longer than ``llm.idle_timeout`` ends the try (keep-alives break a silence only until the answer's
   first words: streaming.py). So a hung server costs seconds, not the minutes a plain read timeout
   times the retries did.
4. Retries exhausted on a retryable error: the next model of the chain. Auth and spend-limit errors,
   an unknown model and malformed answers are not tried again on the same model, since another try
   cannot help there, but the next model of the chain is tried (another provider, another key, a model
   the server has). A context overflow is raised at once: compaction, not another model, makes room.
   When every model failed, the error raised is the last one a later try may cure (an outage, a rate
   limit, a timeout), else the last one: a fallback whose key is refused must not make a primary's
   outage look like a refused key, which the chat would be told at once instead of waiting for the
   model (bot/model_wait.py). The fallback's own error is logged (``llm_fallback_failed``).
5. Success: each tool call gets an id no other call of the conversation has (call_ids.py); a count
   the server did not send is estimated with the injected token counter (estimates.py; logged once
   per model, ``llm_usage_missing``); usage and cost (from the catalog) are added to
   :class:`LLMStats` and reported, with the request's ``purpose``, to the ``usage`` observer (the
   daily ledger), so every call is counted: chat turns, compaction summaries and memory
   consolidation alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Protocol

import httpx
import structlog

from bot import model_choice
from bot.catalog import ModelCatalog, ModelInfo
from bot.config import LLMSettings
from bot.domain import Usage
from bot.errors import LLMAuthError, LLMContextOverflow, LLMError
from bot.llm import anthropic, openai
from bot.llm.answer import Target, error_answer, parse, read_body, read_whole, redirected, within
from bot.llm.breaker import Breakers
from bot.llm.call_ids import made_unique
from bot.llm.endpoints import check_base_url, where
from bot.llm.estimates import fill_missing
from bot.llm.failures import Provider, key_setting
from bot.llm.httpx_errors import HTTPX_ERRORS, httpx_errors, map_httpx_error
from bot.llm.retry_policy import RetryPolicy, exhausted
from bot.llm.stats import LLMStats
from bot.llm.streaming import stream_answer
from bot.llm.types import ChatRequest, ChatResponse, StreamEvent, Wire
from bot.retry import retry
from bot.tokens import TokenCounter

__all__ = ["HTTPX_ERRORS", "LLMClient", "LLMStats", "UsageObserver", "map_httpx_error"]

log = structlog.get_logger(__name__)


class UsageObserver(Protocol):
    """Told about every successful call (bot.usage.UsageLedger is one)."""

    async def record(self, purpose: str, model: str, usage: Usage) -> None: ...


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
    so tests can check backoff without waiting for it, and ``clock`` (monotonic seconds) the circuit
    breaker's cool-downs (breaker.py). Errors are always bot.errors LLM types;
    ``stats`` is read by the ops endpoints. ``counter`` counts a call the server sent no usage for
    (estimates.py); give it the context budget's, whose counts the session's messages cache (the
    default, a character heuristic, is for tools and tests).
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
        clock: Callable[[], float] = time.monotonic,
        counter: TokenCounter | None = None,
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
        self._policy = RetryPolicy(settings, rng)
        self._usage = usage
        self._counter = counter if counter is not None else TokenCounter.approximate()
        self._unmetered: set[str] = set()  # models whose missing usage was logged (once each)
        self.stats = LLMStats()
        self._breakers = Breakers(self.stats, clock)

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
        return model_choice.provider_of(self._settings, self._catalog, model)

    async def chat(self, request: ChatRequest) -> ChatResponse:
        """One complete answer, with retries and failover (see the module docstring)."""
        chain = self._breakers.order(self._policy.chain(request))
        failures: list[LLMError] = []
        for position, model in enumerate(chain):
            try:
                return await self._with_retries(model, request)
            except LLMError as exc:
                self._breakers.failed(model, exc)
                if isinstance(exc, LLMContextOverflow):
                    raise
                failures.append(exc)
                if position == len(chain) - 1:
                    error = exhausted(failures)
                    raise error from error.__cause__  # (the cause it was raised with, if any)
                self._failover(model, chain[position + 1], exc)
        raise AssertionError("the chain is never empty")

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Yield ``text`` and ``tool_call`` deltas as the model writes, then one ``done`` event.

        The ``done`` event carries the whole ChatResponse (text, tool calls, usage). Retries and
        failover happen only before the first delta; after it an error is raised as is, because the
        caller has already shown part of an answer.
        """
        chain = self._breakers.order(self._policy.chain(request))
        failures: list[LLMError] = []
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
                    final = started or isinstance(exc, LLMContextOverflow)
                    if not final and exc.retryable and self._policy.may_retry(exc, attempt):
                        await self._backoff(attempt, exc)
                        continue
                    self._breakers.failed(model, exc)
                    if final:
                        raise
                    failures.append(exc)
                    if position == len(chain) - 1:
                        error = exhausted(failures)
                        raise error from error.__cause__  # (the cause it was raised with, if any)
                    self._failover(model, chain[position + 1], exc)
                    break

    # -- one model ----------------------------------------------------------------------------------

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
            retry_if=lambda exc, tries: isinstance(exc, LLMError) and self._policy.may_retry(exc, tries - 1),
            wait=self._policy.delay,
            on_retry=self._retrying,
            sleep=self._sleep,
        )
        await self._succeeded(model, request, response, elapsed)
        return response

    async def _backoff(self, attempt: int, exc: LLMError) -> None:
        """Wait before try ``attempt + 1`` (the streaming loop's own retry; see :meth:`_with_retries`)."""
        delay = self._policy.delay(exc, attempt + 1)
        self._retrying(exc, attempt + 1, delay)
        await self._sleep(delay)

    def _retrying(self, exc: Exception, tries: int, delay: float) -> None:
        self.stats.retries += 1
        model = getattr(exc, "model", None)
        log.info("llm_retry", model=model, attempt=tries, delay=round(delay, 3), error=str(exc))

    def _failover(self, failed: str, following: str, exc: LLMError) -> None:
        self.stats.failovers += 1
        log.warning("llm_failover", failed=failed, next=following, error=str(exc))

    def _target(self, model: str) -> Target:
        provider = self.provider_of(model)
        settings = self._settings.anthropic if provider == "anthropic" else self._settings.openai
        return Target(model, provider, self._catalog.get(model, provider), settings, self._where[provider])

    def _build(self, target: Target, request: ChatRequest, *, stream: bool) -> httpx.Request:
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
        async with within(seconds, target, f"did not answer within {seconds:g} s"):
            with _httpx_errors(target):
                response = await self._http.send(http_request, stream=True)
                try:
                    body = await read_body(target, response, self._settings.idle_timeout)
                finally:
                    await response.aclose()
        if response.status_code >= 400:
            raise error_answer(target, response, body.decode("utf-8", "replace"))
        if response.status_code >= 300:
            raise redirected(target, response)
        return _unique_ids(target, request, parse(target, body))

    async def _open_stream(self, target: Target, request: ChatRequest) -> httpx.Response:
        """Send a streaming request; the answer must start within ``first_byte_timeout``."""
        http_request = self._build(target, request, stream=True)
        seconds = min(self._settings.first_byte_timeout, request.timeout or float("inf"))
        said = f"did not start answering within {seconds:g} s (llm.first_byte_timeout)"
        async with within(seconds, target, said):
            with _httpx_errors(target):
                return await self._http.send(http_request, stream=True)

    async def _stream_once(self, model: str, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        target = self._target(model)
        idle = self._settings.idle_timeout
        whole = request.timeout or self._settings.timeout  # for a body read whole
        started = time.monotonic()
        final: ChatResponse | None = None
        response = await self._open_stream(target, request)
        try:
            with _httpx_errors(target):
                if response.status_code >= 400:
                    text = (await read_whole(target, response, idle, whole)).decode("utf-8", "replace")
                    raise error_answer(target, response, text)
                if response.status_code >= 300:
                    raise redirected(target, response)
                async with aclosing(stream_answer(target, response, idle, whole)) as events:
                    async for event in events:
                        if event.kind == "done":  # stream_answer's last event
                            final = event.response
                        else:
                            yield event
        finally:
            await response.aclose()
        if final is None:
            raise AssertionError("stream_answer ends with the answer or raises")
        final = _unique_ids(target, request, final)
        await self._succeeded(model, request, final, time.monotonic() - started)
        yield StreamEvent("done", response=final)

    async def _succeeded(
        self, model: str, request: ChatRequest, response: ChatResponse, latency: float
    ) -> None:
        self._metered(model, request, response)
        response.usage.cost_usd = self.info(model).cost(response.usage)
        response.model = response.model or model
        response.model_id = model
        self.stats.succeeded(model, response.usage, latency, request.purpose)
        self._breakers.succeeded(model)
        if self._usage is not None:
            try:
                await self._usage.record(request.purpose, model, response.usage)
            except Exception:  # the answer is here and paid for; a bookkeeping hiccup must not cost it
                log.exception("usage_not_recorded", purpose=request.purpose, model=model)

    def _failed(self, model: str, exc: LLMError) -> None:
        self.stats.failed(model, exc)

    def _metered(self, model: str, request: ChatRequest, response: ChatResponse) -> None:
        """Estimate what the server did not count (estimates.py), and say so once per model."""
        estimated = fill_missing(self._counter, request, response)
        if not estimated or model in self._unmetered:
            return
        self._unmetered.add(model)
        log.warning(
            "llm_usage_missing",
            model=model,
            server=self._where[self.provider_of(model)],
            missing=estimated,
            hint="the endpoint sent no token counts for this answer (an OpenAI-compatible server may "
            "ignore stream_options.include_usage); the usage ledger and /status count membot's own "
            "estimate for such calls (logged once per model)",
        )


def _unique_ids(target: Target, request: ChatRequest, response: ChatResponse) -> ChatResponse:
    prefix = "toolu_" if target.provider == "anthropic" else "call_"
    return made_unique(response, request, prefix, target.model)


def _httpx_errors(target: Target) -> contextlib.AbstractContextManager[None]:
    return httpx_errors(model=target.model, provider=target.provider, where=target.where)
