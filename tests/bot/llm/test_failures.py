"""What an error answer means: status, headers and body mapped to bot.errors types."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from bot.errors import (
    LLMAuthError,
    LLMBadResponse,
    LLMContextOverflow,
    LLMError,
    LLMNotFound,
    LLMRateLimited,
    LLMUnavailable,
)
from bot.llm.failures import error_fields, retry_after_seconds, status_error


def classify(status: int, body: Any = None, headers: dict[str, str] | None = None) -> LLMError:
    text = body if isinstance(body, str) else json.dumps(body or {})
    return status_error(
        status, httpx.Headers(headers or {}), text, model="m", provider="openai", where="OpenAI"
    )


def test_retry_after_forms() -> None:
    h = httpx.Headers
    assert retry_after_seconds(h({"retry-after": "3"})) == 3.0
    assert retry_after_seconds(h({"retry-after": "0.25"})) == 0.25
    assert retry_after_seconds(h({"retry-after-ms": "1500", "retry-after": "2"})) == 1.5
    assert retry_after_seconds(h({"retry-after-ms": "junk", "retry-after": "2"})) == 2.0
    assert retry_after_seconds(h({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}), now=1445412480.0) == 10.0
    assert retry_after_seconds(h({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}), now=1445412500.0) == 0.0
    assert retry_after_seconds(h({"retry-after": "-4"})) == 0.0
    assert retry_after_seconds(h({"retry-after": "soon"})) is None
    assert retry_after_seconds(h({})) is None


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (401, {"error": {"message": "Incorrect API key"}}, LLMAuthError),
        (403, "forbidden", LLMAuthError),
        (429, {"error": {"type": "insufficient_quota", "message": "quota"}}, LLMAuthError),
        (429, {"error": {"type": "rate_limit_error", "message": "slow down"}}, LLMRateLimited),
        (400, {"error": {"code": "context_length_exceeded", "message": "too long"}}, LLMContextOverflow),
        (400, {"error": {"message": "the request exceeds the available context size"}}, LLMContextOverflow),
        (
            413,
            {"error": {"type": "request_too_large", "message": "Request exceeds the maximum size"}},
            LLMContextOverflow,
        ),
        (
            400,
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "input length and "
                    "`max_tokens` exceed context limit: 197000 + 8192 > 200000, decrease input length",
                },
            },
            LLMContextOverflow,
        ),  # Anthropic's wording
        (400, {"error": {"message": "messages: roles must alternate"}}, LLMBadResponse),
        (404, {"error": {"message": "model not found"}}, LLMNotFound),
        (408, {}, LLMUnavailable),
        (409, {}, LLMUnavailable),
        (500, "<html>oops</html>", LLMUnavailable),
        (503, {"error": {"message": "maximum context length"}}, LLMUnavailable),  # 5xx: retry, never overflow
        (
            529,
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            LLMUnavailable,
        ),
    ],
)
def test_status_mapping(status: int, body: Any, expected: type[LLMError]) -> None:
    error = classify(status, body)
    assert type(error) is expected
    assert error.status_code == status and error.model == "m"


def test_hints_travel_with_retryable_errors() -> None:
    limited = classify(429, {}, {"retry-after": "7"})
    assert isinstance(limited, LLMRateLimited) and limited.retry_after == 7.0 and limited.retryable
    overloaded = classify(529, {}, {"retry-after-ms": "250"})
    assert isinstance(overloaded, LLMUnavailable) and overloaded.retry_after == 0.25


def test_messages_tell_the_user_what_to_do() -> None:
    assert "check MEMBOT_LLM__OPENAI__API_KEY" in str(classify(401, {"error": {"message": "bad key"}}))
    assert "Add credit or raise the limit" in str(classify(429, {"error": {"code": "insufficient_quota"}}))
    assert "MEMBOT_LLM__OPENAI__BASE_URL" in str(classify(404, {}))


def test_error_fields_of_both_shapes_and_plain_text() -> None:
    assert error_fields('{"error": {"type": "t", "code": "c", "message": "m"}}') == ("t", "c", "m")
    assert error_fields('{"type": "error", "error": {"type": "overloaded_error", "message": "O"}}') == (
        "overloaded_error",
        "",
        "O",
    )
    assert error_fields('{"error": "plain"}') == ("", "", "plain")
    assert error_fields("Bad Gateway") == ("", "", "Bad Gateway")
