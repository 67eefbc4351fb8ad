"""Where each setting's value came from, for ``membot config``: a flag, the environment, ``.env``, the
TOML file or the default; secrets masked."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from pydantic_settings import DotEnvSettingsSource, EnvSettingsSource

from bot.config import Settings, resolve_config_file
from bot.config_files import TomlSource

SECRET_MASK = "********"
_URL_CREDENTIALS = re.compile(r"(?i)(\b[a-z][a-z0-9+.\-]*://)[^/\s@]+@")


def describe_settings(
    settings: Settings, config_file: Path | None = None, flags: dict[str, Any] | None = None
) -> list[tuple[str, str, str]]:
    """Rows of (setting, shown value, source) for every leaf setting; secrets are masked. ``flags`` are
    the values the command line set (``--workspace``, ``--log-level``), above every other source."""
    toml = resolve_config_file(config_file)
    cls = type(settings)
    sources: list[tuple[str, dict[str, Any]]] = [
        ("flag", _lower_keys(flags or {})),
        ("env", _lower_keys(EnvSettingsSource(cls)())),
        (".env", _lower_keys(DotEnvSettingsSource(cls)())),
    ]
    if toml is not None:
        sources.append((str(toml), _lower_keys(TomlSource(cls, toml_file=toml)())))
    rows: list[tuple[str, str, str]] = []
    for path, value in _leaves(settings.model_dump()):
        origin = "default"
        for name, data in sources:
            if _has_path(data, path):
                origin = name
                break
        rows.append((".".join(path), _show(path, value, settings), origin))
    return rows


def _lower_keys(data: Any) -> Any:
    if isinstance(data, dict):
        return {str(k).lower(): _lower_keys(v) for k, v in data.items()}
    return data


def _has_path(data: dict[str, Any], path: tuple[str, ...]) -> bool:
    node: Any = data
    for key in path:
        if not isinstance(node, dict) or key.lower() not in node:
            return False
        node = node[key.lower()]
    return True


def _leaves(data: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(data, dict) and data:
        for key, value in data.items():
            yield from _leaves(value, (*prefix, str(key)))
    else:
        yield prefix, data


def _show(path: tuple[str, ...], value: Any, settings: Settings) -> str:
    node: Any = settings
    for key in path:
        node = getattr(node, key, None) if not isinstance(node, dict) else node.get(key)
    if isinstance(node, SecretStr):
        return SECRET_MASK if node.get_secret_value() else "(empty)"
    if value is None:
        return "(not set)"
    return _URL_CREDENTIALS.sub(rf"\1{SECRET_MASK}@", str(value))  # a proxy's user:password in a URL
