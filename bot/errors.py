"""The error tree: every failure membot raises on purpose.

MembotError
├── ConfigError          a setting or file is wrong; the message names it and says how to fix it
├── InUseError           what membot needs is held by another process (the workspace, the admin
│                        port): no setting is wrong, and it may be free in a moment
├── StorageError         a workspace file could not be read or written
├── ChannelError         a chat platform refused or failed (start-up, send); may work later
│   └── ChannelRefused   a send the platform refuses for good (the user blocked the bot, the chat
│                        is gone): carries the reason and the fix, in words for the operator
└── LLMError             the model provider failed; retry and failover decide by type
    ├── LLMTimeout       (also a builtin TimeoutError)
    ├── LLMRateLimited   carries retry_after (seconds) when the provider said so
    ├── LLMAuthError     bad or missing key, or an exhausted spend limit: never retried
    ├── LLMUnavailable   connection failures, 5xx, 529 overloaded
    ├── LLMContextOverflow  the prompt is larger than the model's window
    └── LLMBadResponse   the provider answered something we cannot use
        ├── LLMContentFiltered  the provider's content filter declined the request (Azure OpenAI)
        └── LLMNotFound  the server knows no such model or path (404): only the operator can fix it

An error's message is for the operator (it names the setting or file at fault); :func:`plain_reason`
says what a failure type means to a chat user.
"""

from __future__ import annotations


class MembotError(Exception):
    """Base of every error membot raises deliberately."""


class ConfigError(MembotError):
    """Configuration is missing or invalid. The message says which setting and how to fix it."""


class InUseError(MembotError):
    """Another process holds what membot needs: the workspace (another membot runs on it) or the
    admin port. Unlike a :class:`ConfigError` it may be gone in a moment (the old process still
    stopping), so a supervisor should try again: the CLI exits 75 (EX_TEMPFAIL) for it and 78
    (EX_CONFIG) for a wrong setting, which the systemd unit does not restart."""


class StorageError(MembotError):
    """A workspace file could not be read or written."""


class ChannelError(MembotError):
    """A chat platform refused a request or could not be reached."""


class ChannelRefused(ChannelError):
    """The platform refused a send for good: the same send to that chat would be refused again (the
    user blocked the bot, the bot was removed from the group, the chat no longer exists, the bot may
    not write there). Sending it again with pauses only holds the chat's later answers back, so the
    dispatcher sets it aside at once; an outage, a rate limit or a 5xx is a plain :class:`ChannelError`.

    ``reason`` says what happened and ``fix`` what would make the chat reachable again, for the
    operator's log; the message keeps the platform's own words. ``by_user``: the user's own setting
    refuses it (a Discord user who closed their DMs to the bot), which the operator need not act on: it
    is logged as a warning, not an error.
    """

    def __init__(self, message: str, *, reason: str, fix: str, by_user: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.fix = fix
        self.by_user = by_user


class MessageRefused(ChannelRefused):
    """The platform refused this message for good, not the chat: its content (a Discord server's
    automatic moderation, a text Telegram finds empty once formatted). Sent again it is refused again,
    but the chat can still be written to, so the dispatcher tells the chat, in plain words, that the
    answer could not be delivered, instead of keeping it to be refused before every later answer."""


class LLMError(MembotError):
    """The model provider failed. ``retryable`` tells the client whether another try may help, and
    ``retry_after`` how long the provider asked it to wait first (its Retry-After header), if it said."""

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        status_code: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.model = model
        self.status_code = status_code
        self.retry_after = retry_after


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
        super().__init__(message, model=model, status_code=status_code, retry_after=retry_after)


class LLMAuthError(LLMError):
    retryable = False


class LLMUnavailable(LLMError):
    retryable = True


class LLMContextOverflow(LLMError):
    retryable = False


class LLMBadResponse(LLMError):
    retryable = False


class LLMContentFiltered(LLMBadResponse):
    """The provider's content filter declined the request (Azure OpenAI's 400 ``content_filter``): the
    same prompt would be declined again, so it is not retried on the same model, and the chat is told
    what happened rather than that an answer could not be used."""


class LLMNotFound(LLMBadResponse):
    """The server knows no such model, or the base URL misses its path (404): it would fail the same way
    until the operator fixes the setting, so the chat is told that, not that an answer was unusable."""


_PLAIN_REASONS: tuple[tuple[type[MembotError], str], ...] = (
    (LLMTimeout, "the AI model took too long to answer"),
    (LLMRateLimited, "the AI model is busy right now"),
    (LLMAuthError, "the AI model refused the bot's access; the operator needs to check its settings"),
    (LLMContextOverflow, "this conversation is too long for the AI model; /compact or /new makes room"),
    (LLMUnavailable, "the AI model cannot be reached right now"),
    (LLMContentFiltered, "the AI provider's content filter declined this request"),
    (LLMNotFound, "the AI model is not set up right; the operator needs to check its settings"),
    (LLMBadResponse, "the AI model sent an answer that could not be used"),
)


def plain_reason(kind: type[BaseException]) -> str:
    """What a failure of this type means, in words for a chat user.

    The error's own message is for the operator: it names servers, settings and keys' variables, so
    it goes to the log and never into a chat.
    """
    return next(
        (words for known, words in _PLAIN_REASONS if issubclass(kind, known)),
        "something went wrong on my side; the details are in the log",
    )
