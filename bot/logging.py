"""Structured logging: readable lines on a terminal, JSON lines everywhere else, secrets never shown.

Every line of a turn carries ``session_id``, ``channel`` and ``turn_id`` (bound as context variables by
the dispatcher). The redaction processor masks configured secrets wherever they appear and anything that
looks like an API key or bot token, including inside exception text.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, TextIO

import structlog
from structlog.typing import EventDict, Processor

from bot.storage import FILE_MODE, ensure_private_dir

MASK = "***"
LOG_FILE_BYTES = 5_000_000

# Shapes of credentials that must never reach a log, even when they are not in our settings.
_PATTERNS = [
    re.compile(r"sk-(?:ant-|proj-)?[A-Za-z0-9_\-]{16,}"),  # OpenAI / Anthropic keys
    re.compile(r"(?<!\d)\d{6,12}:[A-Za-z0-9_\-]{30,}"),  # Telegram bot tokens (also inside URLs)
    # Discord tokens: the bot's id in base64 first ("M" for ids starting 1-3, "N" for 4-7, "O" for 8-9)
    re.compile(r"\b[MNO][A-Za-z\d_\-]{23,25}\.[A-Za-z\d_\-]{6}\.[A-Za-z\d_\-]{27,}\b"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._\-]{12,}"),
    re.compile(r"(?i)(x-api-key['\"]?\s*[:=]\s*['\"]?)[A-Za-z0-9._\-]{12,}"),
    re.compile(r"\bAIza[0-9A-Za-z_\-]{30,}"),  # Google API keys
    # A key a provider echoes back: "Incorrect API key provided: ...", "api_key=...", "?key=...".
    re.compile(
        r"(?i)((?<![a-z0-9])api[ _-]?key(?:\s+(?:provided|received|given))?['\"]?\s*[:=]\s*['\"]?)"
        r"[^\s'\",;]{6,}"
    ),
    re.compile(r"(?i)([?&](?:api[_-]?)?key=)[^&\s'\"]+"),
    # Credentials in a URL (https://user:password@host): the whole user-info part.
    re.compile(r"(?i)(\b[a-z][a-z0-9+.\-]*://)[^/\s@'\"]+@"),
]


def _masked(match: re.Match[str]) -> str:
    kept = match.group(1) if match.groups() else ""
    return kept + MASK + ("@" if match.group(0).endswith("@") else "")


class SecretRedactor:
    """A structlog processor masking known secrets and credential-shaped strings in every value."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        for pattern in _PATTERNS:
            text = pattern.sub(_masked, text)
        return text

    def _value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, dict):
            return {self._value(k) if isinstance(k, str) else k: self._value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self._value(v) for v in value)
        if isinstance(value, BaseException):
            return self.redact(f"{type(value).__name__}: {value}")
        # Anything else (an httpx.URL, a Path, bytes, a set) is printed by the renderer as it is: a
        # secret in it would pass unmasked, so it is printed as its masked text instead.
        try:
            text = str(value)
        except Exception:  # a value that cannot say what it is holds nothing to mask
            return value
        masked = self.redact(text)
        return value if masked == text else masked

    def __call__(self, logger: Any, method: str, event_dict: EventDict) -> EventDict:
        for key, value in list(event_dict.items()):
            event_dict[key] = self._value(value)
        return event_dict


def redact_shapes(text: str) -> str:
    """``text`` with every credential-shaped string masked (for what leaves the process other than
    through the log, such as /healthz)."""
    return _SHAPES.redact(text)


_SHAPES = SecretRedactor()


def configure_logging(
    *,
    level: str = "INFO",
    fmt: Literal["auto", "console", "json"] = "auto",
    secrets: Iterable[str] = (),
    stream: TextIO | None = None,
    file: Path | None = None,
) -> SecretRedactor:
    """Set up structlog and the stdlib root logger (libraries log through it) once, at start-up.

    ``file``: log there (JSON lines, rotated at 5 MB, two old files kept, 0600 in a 0700 folder)
    instead of to ``stream``. ``membot chat`` does this, so tracebacks never land in the chat on the
    terminal. It touches the disk: call it off the event loop.
    """
    out = stream or sys.stderr
    use_console = file is None and not renders_json(fmt, out)
    redactor = SecretRedactor(secrets)
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Processor = (
        structlog.dev.ConsoleRenderer(colors=out.isatty())
        if use_console
        else structlog.processors.JSONRenderer()
    )
    # Tracebacks are rendered to text first so the redactor sees them too.
    tail: list[Processor] = [
        structlog.processors.format_exc_info,
        redactor,
        renderer,
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail],
    )
    handler = _file_handler(file) if file is not None else logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()  # a log file is closed; a stream handler leaves its stream open
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "discord.gateway", "discord.client", "telegram.ext", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
    return redactor


def renders_json(fmt: Literal["auto", "console", "json"], stream: TextIO) -> bool:
    """Whether a log to ``stream`` is JSON lines: ``json``, or ``auto`` where no one reads it on a
    terminal (systemd's journal, ``docker logs``, a pipe)."""
    return fmt == "json" or (fmt == "auto" and not stream.isatty())


def _file_handler(path: Path) -> logging.Handler:
    ensure_private_dir(path.parent)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE))  # created private
    return logging.handlers.RotatingFileHandler(
        path, maxBytes=LOG_FILE_BYTES, backupCount=2, encoding="utf-8", errors="backslashreplace"
    )
