"""Settings: one typed tree loaded once in bot/app.py, then handed down as slices.

Sources, highest priority first: values passed in (CLI flags), environment variables (``MEMBOT_`` prefix,
``__`` between nesting levels, e.g. ``MEMBOT_LLM__MODEL``), a ``.env`` file, an optional TOML file, then
the defaults the classes set. ``deploy/membot.example.toml`` documents every setting; keep the two in step.
The tables of the tree (``[llm]``, ``[telegram]``, ...): bot/config_sections.py; how an id list is read:
bot/config_ids.py; where each value came from (``membot config``): bot/config_describe.py. This module is
the public face: import settings types from here.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from bot.config_errors import ENV_PREFIX, explain_undecodable, explain_validation, unknown_variables
from bot.config_files import TomlSource, watch_dotenv
from bot.config_sections import (
    AdminSettings,
    CompactionSettings,
    DiscordSettings,
    DispatcherSettings,
    LifecycleSettings,
    LLMSettings,
    MemorySettings,
    ProviderSettings,
    SessionSettings,
    TelegramGroupSettings,
    TelegramSettings,
    TerminalSettings,
    ToolSettings,
)
from bot.errors import ConfigError

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "AdminSettings",
    "CompactionSettings",
    "DiscordSettings",
    "DispatcherSettings",
    "LLMSettings",
    "LifecycleSettings",
    "MemorySettings",
    "ProviderSettings",
    "SessionSettings",
    "Settings",
    "TelegramGroupSettings",
    "TelegramSettings",
    "TerminalSettings",
    "ToolSettings",
    "load_settings",
    "resolve_config_file",
]

DEFAULT_HOME = Path("~/.membot")
DEFAULT_CONFIG_FILE = DEFAULT_HOME / "membot.toml"


class Settings(BaseSettings):
    """The whole configuration tree. Build it with :func:`load_settings`, not directly."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        env_file=".env",
        env_file_encoding="utf-8",
        # A .env is often shared with other programs (OPENAI_API_KEY, DATABASE_URL): only MEMBOT_ keys
        # are ours, and an unknown one of those is still an error.
        dotenv_filtering="match_prefix",
        # An empty variable is an unset one: `KEY=` placeholder lines in an env file, and compose's
        # `${KEY}` of a variable the host does not set, mean "not used here", as in most programs. Set,
        # an unused empty key stopped the start, and a used one failed every call with 401.
        env_ignore_empty=True,
        extra="forbid",
        validate_default=True,
    )

    workspace: Path = DEFAULT_HOME / "workspace"
    models_file: Path | None = None
    timezone: str = "UTC"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["auto", "console", "json"] = "auto"
    system_prompt: str = (
        "You are membot, a helpful assistant that remembers past conversations. "
        "Answer concisely and honestly; say so when you do not know."
    )

    llm: LLMSettings = Field(default_factory=LLMSettings)
    sessions: SessionSettings = Field(default_factory=SessionSettings)
    dispatcher: DispatcherSettings = Field(default_factory=DispatcherSettings)
    compaction: CompactionSettings = Field(default_factory=CompactionSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    tools: ToolSettings = Field(default_factory=ToolSettings)
    terminal: TerminalSettings = Field(default_factory=TerminalSettings)
    telegram: TelegramSettings = Field(default_factory=TelegramSettings)
    discord: DiscordSettings = Field(default_factory=DiscordSettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    lifecycle: LifecycleSettings = Field(default_factory=LifecycleSettings)

    @field_validator("workspace", "models_file", mode="after")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {value!r} (use an IANA name such as Europe/Berlin)") from exc
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, dotenv_settings, TomlSource(settings_cls))

    @property
    def sessions_dir(self) -> Path:
        return self.workspace / "sessions"

    @property
    def memory_dir(self) -> Path:
        return self.workspace / "memory"

    @property
    def state_dir(self) -> Path:
        """The bot's own bookkeeping between runs (``<workspace>/state``): tool-call records, model waits,
        Telegram's update journal and sent chunks, Discord's seen marks, each channel's command menu."""
        return self.workspace / "state"

    @property
    def config_file(self) -> Path | None:
        """The TOML file these settings were read from, if any (``load_settings``)."""
        toml = self.model_config.get("toml_file")
        return Path(toml) if isinstance(toml, str | Path) else None

    @property
    def env_file(self) -> Path | None:
        """The ``.env`` file these settings were read from, if any (``load_settings``)."""
        env = self.model_config.get("env_file")
        return Path(env) if isinstance(env, str | Path) else None

    @property
    def secrets(self) -> list[str]:
        """The values no log, ``/healthz`` or CLI line may show: every token and key that is set."""
        values = [
            self.llm.openai.api_key,
            self.llm.anthropic.api_key,
            self.telegram.token,
            self.telegram.webhook_secret,
            self.discord.token,
            self.memory.embeddings_api_key,
        ]
        return [v.get_secret_value() for v in values if v is not None]

    @property
    def chat_log(self) -> Path:
        """Where ``membot chat`` logs (the terminal shows only the chat)."""
        return self.workspace / "logs" / "chat.log"

    @property
    def memory_timezone(self) -> str:
        return self.memory.timezone or self.timezone


def resolve_config_file(explicit: Path | None) -> Path | None:
    """The TOML file to read: ``--config``, else ``$MEMBOT_CONFIG``, else ~/.membot/membot.toml if present."""
    if explicit is not None:
        path = explicit.expanduser()
        if not path.is_file():
            problem = "is a folder, not a TOML file" if path.is_dir() else "does not exist"
            raise ConfigError(f"config file {path} {problem} (check --config / MEMBOT_CONFIG)")
        return path
    from_env = os.environ.get("MEMBOT_CONFIG")
    if from_env:
        return resolve_config_file(Path(from_env))
    default = DEFAULT_CONFIG_FILE.expanduser()
    return default if default.is_file() else None


def _settings_class(config_file: Path | None, env_file: Path | None) -> type[Settings]:
    class _Configured(Settings):
        model_config = SettingsConfigDict(toml_file=config_file, env_file=env_file)

    _Configured.__name__ = "Settings"
    return _Configured


def load_settings(
    config_file: Path | None = None,
    *,
    env_file: Path | None = Path(".env"),
    overrides: dict[str, Any] | None = None,
) -> Settings:
    """Load and validate settings; raise :class:`ConfigError` naming every bad field and how to set it."""
    toml = resolve_config_file(config_file)
    cls = _settings_class(toml, env_file)
    watch_dotenv(env_file)
    unknown = unknown_variables(Settings, os.environ)
    if unknown:
        raise ConfigError("invalid configuration:\n" + "\n".join(unknown))
    try:
        return cls(**(overrides or {}))
    except ValidationError as exc:
        raise ConfigError(explain_validation(exc, toml, Settings, env_file=env_file)) from None
    except tomllib.TOMLDecodeError as exc:  # its message says where: "(at line 3, column 7)"
        raise ConfigError(f"{toml} is not valid TOML: {exc}") from None
    except SettingsError as exc:  # a value that should be JSON (a list, a table) is not
        raise ConfigError(explain_undecodable(exc, env_file, Settings)) from None
    except UnicodeDecodeError as exc:  # the TOML file says so itself (config_files.py): this is the .env
        raise ConfigError(
            f"{env_file} is not UTF-8 text (the byte 0x{exc.object[exc.start : exc.start + 1].hex()}): "
            "save it as UTF-8"
        ) from None
    except (OSError, ValueError) as exc:  # unreadable TOML / .env
        raise ConfigError(f"could not read configuration: {exc}") from None
