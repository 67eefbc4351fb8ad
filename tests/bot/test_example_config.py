"""deploy/membot.example.toml documents every setting, and its values are the real defaults."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from bot.config import Settings, load_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "membot.example.toml"


def leaf_names(model: type[BaseModel], prefix: str = "") -> set[str]:
    names = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names |= leaf_names(annotation, f"{prefix}{name}.")
        else:
            names.add(prefix + name)
    return names


def documented_names(text: str) -> set[str]:
    """Keys set or shown commented-out (``# key = value``), qualified by their [table]."""
    names, table = set(), ""
    for raw in text.splitlines():
        line = raw.strip()
        header = re.match(r'^#?\s*\[([a-z_.]+?)(?:\."[^"]*")?\]\s*$', line)
        if header:
            names.add(header.group(1))  # a table documents a dict-valued setting by its name
            table = header.group(1) + "."
            continue
        key = re.match(r"^#?\s*([a-z_]+)\s*=", line)
        if key:
            names.add(table + key.group(1))
    return names


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and not key.endswith(("allow", "deny", "groups", "overrides")):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = value
    return out


def test_every_setting_is_documented() -> None:
    missing = leaf_names(Settings) - documented_names(EXAMPLE.read_text())
    assert not missing, f"add these to deploy/membot.example.toml: {sorted(missing)}"


def test_uncommented_values_are_the_defaults() -> None:
    example = flatten(tomllib.loads(EXAMPLE.read_text()))
    defaults = flatten(Settings.model_construct().model_dump(mode="json"))
    for name, value in example.items():
        assert name in defaults, f"{name} is not a setting"
        assert value == defaults[name], f"{name}: example says {value!r}, default is {defaults[name]!r}"


def test_the_example_loads_through_the_real_loader_as_the_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What an operator does with it: `membot --config deploy/membot.example.toml`. The checks above
    read it with tomllib; this one goes through load_settings (its TOML source, validators, id lists)."""
    for name in list(os.environ):
        if name.startswith("MEMBOT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no .env of the repository's
    loaded = load_settings(EXAMPLE, env_file=None)
    assert loaded.config_file == EXAMPLE
    assert loaded.model_dump() == load_settings(env_file=None).model_dump()
