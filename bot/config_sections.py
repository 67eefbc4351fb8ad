"""The settings tables: one class per ``[table]`` of the TOML file (``MEMBOT_<TABLE>__...`` in the
environment), each refusing the values no bot could run with.

bot/config.py's :class:`~bot.config.Settings` holds one of each; components receive theirs
(``settings.llm``, ``settings.telegram``), never the whole tree. A key or token is refused when blank or
misshapen, and the message never repeats its value.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator

from bot.config_ids import AdminIdList, IdList

_BOT_TOKEN = re.compile(r"[0-9]+:[A-Za-z0-9_-]+")  # what @BotFather gives: "<bot id>:<secret>"
WEBHOOK_SECRET_MIN = 16  # characters of telegram.webhook_secret (see TelegramSettings._secret_strength)


def _not_blank(value: SecretStr | None) -> SecretStr | None:
    # An empty environment variable is unset (Settings' env_ignore_empty); what reaches this is a blank
    # one (spaces) or an empty string in the TOML file, which would be sent as a key and fail every call
    # with 401. Refused as a wrong setting (78, named; `membot doctor` shows it), as an empty base_url
    # is. The message never repeats the value.
    if value is not None and not value.get_secret_value().strip():
        raise ValueError("is blank: set it, or remove the setting to leave it unset")
    return value


_Secret = Annotated[SecretStr | None, AfterValidator(_not_blank)]  # a key or token: unset, or not blank


class _Section(BaseModel):
    """A settings group. Unknown keys are errors, so a typo in a config file never passes silently."""

    model_config = ConfigDict(extra="forbid")


class ProviderSettings(_Section):
    api_key: _Secret = None
    base_url: str | None = None  # None: the provider's public endpoint


class LLMSettings(_Section):
    model: str = "gpt-4.1-mini"
    provider: Literal["openai", "anthropic"] | None = None  # None: taken from models.json, else openai
    fallback_models: list[str] = Field(default_factory=list)
    openai: ProviderSettings = Field(default_factory=ProviderSettings)
    anthropic: ProviderSettings = Field(default_factory=ProviderSettings)
    timeout: float = Field(default=60.0, gt=0)  # one whole non-streamed answer
    connect_timeout: float = Field(default=10.0, gt=0)
    first_byte_timeout: float = Field(default=30.0, gt=0)  # until a streamed answer starts
    idle_timeout: float = Field(default=30.0, gt=0)  # silence allowed once an answer started
    max_retries: int = Field(default=3, ge=0)
    retry_base_delay: float = Field(default=0.5, ge=0)
    retry_max_delay: float = Field(default=20.0, ge=0)
    max_output_tokens: int = Field(default=2048, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)


class SessionSettings(_Section):
    cache_size: int = Field(default=256, ge=1)
    max_inbound_chars: int = Field(default=16000, ge=100)


class DispatcherSettings(_Section):
    mode: Literal["collect", "per_message"] = "collect"
    queue_limit: int = Field(default=20, ge=1)
    turn_timeout: float = Field(default=900.0, gt=0)
    recover_max_age: float = Field(default=21600.0, ge=0)  # seconds; 0: answer recovered messages of any age
    # Seconds an answer that could not be delivered stays in the inbox to be tried again; older ones are
    # moved to inbox/expired/. 0: tried again whatever their age.
    kept_reply_max_age: float = Field(default=604800.0, ge=0)
    # A turn the model could not answer (unreachable, rate limited, too slow, past the LLM client's own
    # retries and fallbacks) is tried again by itself: first after model_retry_first seconds, then with
    # pauses doubling up to model_retry_max, for up to model_retry_max_age seconds since it first failed;
    # then the chat is told to send it again. 0: no waiting, the chat is told at once.
    model_retry_first: float = Field(default=30.0, gt=0)
    model_retry_max: float = Field(default=300.0, gt=0)
    model_retry_max_age: float = Field(default=3600.0, ge=0)


class CompactionSettings(_Section):
    enabled: bool = True
    threshold: float = Field(default=0.8, gt=0.0, le=1.0)
    keep_last: int = Field(default=20, ge=1)
    summary_timeout: float = Field(default=15.0, gt=0)
    summary_max_tokens: int = Field(default=1024, ge=1)
    max_overflow_retries: int = Field(default=3, ge=0)


class MemorySettings(_Section):
    enabled: bool = True
    timezone: str | None = None  # None: the top-level timezone
    memory_window: int = Field(default=50, ge=0)
    keep_recent: int = Field(default=10, ge=1)
    max_memory_size: int = Field(default=8192, ge=0)
    # The bot never grows MEMORY.md past this (its writes are refused; the operator's edits are not).
    max_memory_hard_size: int = Field(default=65536, ge=1024)
    # The longest single fact the model may store through the memory tool or a consolidation.
    max_fact_chars: int = Field(default=1000, ge=50)
    # MEMORY.replaced.md moves to MEMORY.replaced.1.md when it would pass this many bytes.
    replaced_max_size: int = Field(default=1_048_576, ge=4096)
    inject_max_bytes: int = Field(default=8192, ge=0)
    recent_days: int = Field(default=7, ge=0)
    consolidation_timeout: float = Field(default=30.0, gt=0)
    pack_soft_tokens: int = Field(default=2800, ge=0)
    pack_hard_tokens: int = Field(default=4000, ge=0)
    recall_floor: float = Field(default=0.2, ge=0.0, le=1.0)  # least relevance, as a share of the best match
    max_message_tokens: int = Field(default=900, ge=50)  # a longer message shows only the parts that matched
    promotion_confidence: float = Field(default=0.75, ge=0.0, le=1.0)
    decay_days: int = Field(default=30, ge=1)
    embeddings: Literal["none", "openai", "local"] = "local"
    embeddings_base_url: str | None = None
    embeddings_model: str = "text-embedding-3-small"
    embeddings_api_key: _Secret = None
    embeddings_local_model: str = "all-MiniLM-L6-v2"
    notes_max_tokens: int = Field(default=600, ge=0)  # today's notes (and recent days when nothing matched)
    consolidation_model: str | None = None  # None: the primary model; e.g. the `balanced` tier's model
    # "chat": each chat (session id) remembers only what was said in it; MEMORY.md stays the operator's
    # shared file and every chat gets its own bot-written one (see bot/memory/scope.py).
    scope: Literal["workspace", "chat"] = "workspace"

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        # Validating also loads the zone into ZoneInfo's cache, so the memory service never reads
        # tz files from inside the event loop.
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        if value is None:
            return None
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {value!r} (use an IANA name such as Europe/Berlin)") from exc
        return value


class ToolSettings(_Section):
    enabled: list[str] = Field(default_factory=lambda: ["memory", "files", "web_fetch", "time"])
    max_llm_calls: int = Field(default=20, ge=1)
    max_tool_calls: int = Field(default=80, ge=0)
    turn_deadline: float = Field(default=600.0, gt=0)
    tool_timeout: float = Field(default=60.0, gt=0)
    max_parallel: int = Field(default=4, ge=1)
    result_max_chars: int = Field(default=16000, ge=100)
    max_file_read_bytes: int = Field(default=1_000_000, ge=1)
    web_max_bytes: int = Field(default=2_000_000, ge=1)
    web_timeout: float = Field(default=20.0, gt=0)
    web_max_redirects: int = Field(default=5, ge=0)
    shell_enabled: bool = False
    shell_allow: list[str] = Field(
        default_factory=lambda: ["ls", "cat", "grep", "wc", "head", "tail", "date"]
    )
    shell_timeout: float = Field(default=30.0, gt=0)
    shell_max_memory_bytes: int = Field(default=512 * 1024 * 1024, ge=16 * 1024 * 1024)
    channel_allow: dict[str, list[str]] = Field(default_factory=dict)
    channel_deny: dict[str, list[str]] = Field(default_factory=dict)


class TerminalSettings(_Section):
    enabled: bool = False  # `membot run` starts it only when asked; `membot chat` always uses it
    user: str = Field(default_factory=lambda: os.environ.get("USER", "local") or "local")


class TelegramGroupSettings(_Section):
    require_mention: bool = True


class TelegramSettings(_Section):
    token: SecretStr | None = None
    allowed_users: IdList = Field(default_factory=list)  # user ids; "*" opens the bot deliberately
    allowed_groups: IdList = Field(default_factory=list)
    admin_users: AdminIdList = Field(default_factory=list)  # see the operator's figures in /status
    groups: dict[str, TelegramGroupSettings] = Field(default_factory=dict)
    require_mention: bool = True
    pairing: bool = True
    mode: Literal["polling", "webhook"] = "polling"
    webhook_listen: str = "127.0.0.1"
    webhook_port: int = Field(default=8443, ge=0, le=65535)
    webhook_url: str | None = None
    webhook_secret: _Secret = None
    base_url: str | None = None  # for tests / self-hosted Bot API servers
    base_file_url: str | None = None
    streaming: bool = False
    max_document_bytes: int = Field(default=1_000_000, ge=0)
    download_timeout: float = Field(default=60.0, gt=0)  # seconds for a whole photo or document download
    join_window: float = Field(default=1.0, ge=0)
    poll_timeout: int = Field(default=30, ge=0)

    @field_validator("token")
    @classmethod
    def _token_shape(cls, value: SecretStr | None) -> SecretStr | None:
        # Refused here, as a wrong setting (78, named; `membot doctor` shows it): PTB refused a blank one
        # with a traceback, and Telegram a mistyped one only at the start, as a channel failure (exit 1,
        # which the systemd unit restarts over and over). The message never repeats the value.
        if value is not None and not _BOT_TOKEN.fullmatch(value.get_secret_value()):
            raise ValueError(
                "is not a bot token (digits, a colon, then letters: 123456789:AAH...): copy it again "
                "from @BotFather, or remove the setting to run without Telegram"
            )
        return value

    @field_validator("webhook_secret")
    @classmethod
    def _secret_strength(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        # The secret header is all that tells Telegram's posts to the webhook from anyone's who reaches
        # it (the URL is public): one who guesses it posts updates "from" an allowed user and uses the bot
        # as them. Telegram takes 1-256 of A-Z a-z 0-9 _ -; 16 random ones are past guessing. The message
        # never repeats the value. Only in webhook mode (``mode`` is validated before it): polling opens
        # no webhook, and a short secret left over from a test stopped a working bot from starting.
        webhook = info.data.get("mode") == "webhook"
        if webhook and value is not None and len(value.get_secret_value().strip()) < WEBHOOK_SECRET_MIN:
            raise ValueError(
                f"is too short to keep strangers out of the webhook (at least {WEBHOOK_SECRET_MIN} "
                "characters): use a random one, such as the output of `openssl rand -hex 16`"
            )
        return value


class DiscordSettings(_Section):
    token: _Secret = None
    allowed_users: IdList = Field(default_factory=list)
    allowed_guilds: IdList = Field(default_factory=list)
    allowed_channels: IdList = Field(default_factory=list)
    admin_users: AdminIdList = Field(default_factory=list)  # see the operator's figures in /status
    require_mention: bool = True
    mention_overrides: dict[str, bool] = Field(default_factory=dict)  # guild or channel id -> require
    pairing: bool = True
    streaming: bool = False
    max_attachment_bytes: int = Field(default=1_000_000, ge=0)
    download_timeout: float = Field(default=60.0, gt=0)  # seconds for a message's attachments, all of them
    stream_edit_interval: float = Field(default=1.5, ge=0.2)  # seconds between edits while streaming
    sync_commands: bool = True  # register /status, /new, ... as slash commands (only when changed)
    send_retries: int = Field(default=4, ge=0)  # extra tries on 5xx / network errors, with backoff
    send_retry_delay: float = Field(default=1.0, ge=0.0)  # first backoff delay; doubles, max 30 s
    start_timeout: float = Field(default=60.0, gt=0)  # login + gateway READY
    # At each fresh gateway session, per chat the bot talks in (and per server channel with news since it
    # was last connected): how many of the messages it missed are taken in, the newest (0: no catch-up;
    # older ones are skipped and counted in the log), and the age in seconds past which they are skipped,
    # counted in the log (0: any age).
    catch_up_max_messages: int = Field(default=50, ge=0, le=1000)
    catch_up_max_age: float = Field(default=86400.0, ge=0)
    api_base: str | None = None  # for tests
    gateway_url: str | None = None


class AdminSettings(_Section):
    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(default=9464, ge=0, le=65535)  # 0: any free port


class LifecycleSettings(_Section):
    grace_period: float = Field(default=20.0, ge=0)
    on_channel_failure: Literal["stop", "degraded"] = "degraded"
