"""The error tree: every failure membot raises on purpose.

MembotError
├── ConfigError          a setting or file is wrong; the message names it and says how to fix it
├── StorageError         a workspace file could not be read or written
├── ChannelError         a chat platform refused or failed (start-up, send)
└── LLMError             the model provider failed; retry and failover decide by type
    ├── LLMTimeout       (also a builtin TimeoutError)
    ├── LLMRateLimited   carries retry_after (seconds) when the provider said so
    ├── LLMAuthError     bad or missing key, or an exhausted spend limit: never retried
    ├── LLMUnavailable   connection failures, 5xx, 529 overloaded
    ├── LLMContextOverflow  the prompt is larger than the model's window
    └── LLMBadResponse   the provider answered something we cannot use
"""

from __future__ import annotations


class MembotError(Exception):
    """Base of every error membot raises deliberately."""


class ConfigError(MembotError):
    """Configuration is missing or invalid. The message says which setting and how to fix it."""


class StorageError(MembotError):
    """A workspace file could not be read or written."""


class ChannelError(MembotError):
    """A chat platform refused a request or could not be reached."""


class LLMError(MembotError):
    """The model provider failed. ``retryable`` tells the client whether another try may help."""

    retryable: bool = False

    def __init__(self, message: str, *, model: str | None = None, status_code: int | None = None) -> None:
        super().__init__(message)
        self.model = model
        self.status_code = status_code


class LLMTimeout(LLMError, TimeoutError):
    retryable = True


class LLMRateLimited(LLMError):
    retryable = True

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        model: str | None = None,
        status_code: int | None = 429,
    ) -> None:
        super().__init__(message, model=model, status_code=status_code)
        self.retry_after = retry_after


class LLMAuthError(LLMError):
    retryable = False


class LLMUnavailable(LLMError):
    retryable = True

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        model: str | None = None,
        status_code: int | None = None,
    ) -> None:
        super().__init__(message, model=model, status_code=status_code)
        self.retry_after = retry_after


class LLMContextOverflow(LLMError):
    retryable = False


class LLMBadResponse(LLMError):
    retryable = False
