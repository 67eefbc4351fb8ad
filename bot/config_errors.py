"""Why a configuration was refused, said so that the operator can fix it.

pydantic reports a location and a message; these name the environment variable or the file to
change, suggest the setting a misspelled key probably meant, and find the variable behind a JSON
value that does not parse (pydantic-settings names only its top-level table).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_settings import NoDecode, SettingsError

ENV_PREFIX = "MEMBOT_"
NOT_SETTINGS = frozenset({"MEMBOT_CONFIG"})  # ours, but read by the command line, not a setting


def unknown_variables(root: type[BaseModel], environ: Mapping[str, str]) -> list[str]:
    """A line for every ``MEMBOT_`` variable of the environment that names no top-level setting or
    table, with the one it probably meant. pydantic-settings looks up only the names it knows, so
    ``MEMBOT_TELEGRAM_TOKEN`` (one underscore) was ignored without a word and the bot started without its
    token. (A wrong name inside a table, ``MEMBOT_LLM__MODLE``, reaches pydantic, which refuses it.)"""
    lines = []
    for name in sorted(environ):
        upper = name.upper()
        top = upper[len(ENV_PREFIX) :].split("__", 1)[0].lower()
        if not upper.startswith(ENV_PREFIX) or upper in NOT_SETTINGS or top in root.model_fields:
            continue
        import difflib  # only on this error path: start-up stays lean

        guess = difflib.get_close_matches(upper, list(_variable_names(root)), n=1, cutoff=0.6)
        hint = f"; did you mean {guess[0]}?" if guess else ""
        lines.append(f"  - {name}: no such setting{hint} (rename or unset it)")
    return lines


def _variable_names(root: type[BaseModel], prefix: str = ENV_PREFIX) -> Iterator[str]:
    for key, field in root.model_fields.items():
        name = prefix + key.upper()
        yield name
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            yield from _variable_names(model, name + "__")


def explain_validation(
    exc: ValidationError, toml: Path | None, root: type[BaseModel], *, env_file: Path | None = None
) -> str:
    """Every bad field, with the variable or file line to fix; an unknown key gets a "did you mean"."""
    lines = ["invalid configuration:"]
    in_file = _dotenv_keys(env_file)
    for error in exc.errors():
        loc = error["loc"]
        # A list is one variable and one key: its item (an int in loc) is named apart, not as a level.
        index = next((i for i, part in enumerate(loc) if isinstance(part, int)), len(loc))
        path = [str(p) for p in loc[:index]]
        item = f", item {int(loc[index]) + 1}" if index < len(loc) else ""
        dotted = ".".join(path)
        env = ENV_PREFIX + "__".join(p.upper() for p in path)
        from_file = env not in os.environ and env in in_file
        if error["type"] == "extra_forbidden":
            import difflib  # only on this error path: start-up stays lean

            if from_file and not toml:  # a variable of the .env: named as a variable, as in the environment
                guess = difflib.get_close_matches(env, list(_variable_names(root)), n=1, cutoff=0.6)
                hint = f"; did you mean {guess[0]}?" if guess else ""
                lines.append(f"  - {env}: no such setting{hint} (rename it or remove it from {env_file})")
                continue
            where = f"remove {env} from {env_file}" if from_file else f"unset {env}"
            where = f"remove it from {toml} or {where}" if toml else where
            guess = difflib.get_close_matches(path[-1], _known_keys(root, path[:-1]), n=1, cutoff=0.6)
            hint = f"; did you mean `{'.'.join([*path[:-1], guess[0]])}`?" if guess else ""
            lines.append(f"  - {dotted}: unknown setting{hint} ({where})")
            continue
        where = (
            f"set {env}"
            + (f" in {env_file}" if from_file else "")
            + (f" or `{dotted}` in {toml}" if toml else "")
        )
        lines.append(f"  - {dotted}{item}: {error['msg']} ({where})")
    return "\n".join(lines)


def _dotenv_keys(env_file: Path | None) -> set[str]:
    """The variable names a .env file sets, upper-cased (as pydantic-settings matches them)."""
    if env_file is None or not env_file.is_file():
        return set()
    from dotenv import dotenv_values

    return {key.upper() for key in dotenv_values(env_file)}


def _known_keys(root: type[BaseModel], path: list[str]) -> list[str]:
    """The setting names valid at ``path`` (a table of the tree), for "did you mean"."""
    model: Any = root
    for key in path:
        field = (
            model.model_fields.get(key) if isinstance(model, type) and issubclass(model, BaseModel) else None
        )
        if field is None:  # a key of a dict-valued table such as telegram.groups."<id>"
            model = get_args(model)[-1] if get_origin(model) is dict else None
            continue
        model = field.annotation
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def explain_undecodable(exc: SettingsError, env_file: Path | None, root: type[BaseModel]) -> str:
    """Name the variable whose value is not the JSON its setting needs (pydantic-settings names
    only the top-level field)."""
    values = {k: v for k, v in os.environ.items() if k.upper().startswith(ENV_PREFIX)}
    if env_file is not None and env_file.is_file():
        from dotenv import dotenv_values

        from_file = dotenv_values(env_file).items()
        values = {
            **{k: v for k, v in from_file if v is not None and k.upper().startswith(ENV_PREFIX)},
            **values,
        }
    bad = []
    for name, value in sorted(values.items()):
        try:
            json.loads(value)
        except json.JSONDecodeError as error:
            if value.strip()[:1] in ("[", "{") or _is_container(root, name):
                bad.append(f"{name} is not valid JSON ({error.msg} at position {error.pos})")
    if not bad:
        return f"could not read configuration: {exc}"
    example = 'e.g. MEMBOT_LLM__FALLBACK_MODELS=\'["gpt-4.1-mini", "claude-haiku-4-5"]\''
    return "invalid configuration:\n" + "\n".join(f"  - {b}" for b in bad) + f"\n  lists are JSON, {example}"


def _is_container(root: type[BaseModel], env_name: str) -> bool:
    """Whether the setting a ``MEMBOT_...`` variable names holds a list or a table."""
    model: Any = root
    metadata: list[Any] = []
    for key in env_name[len(ENV_PREFIX) :].lower().split("__"):
        field = (
            model.model_fields.get(key) if isinstance(model, type) and issubclass(model, BaseModel) else None
        )
        if field is None:
            return False
        model, metadata = field.annotation, field.metadata
    return get_origin(model) in (list, dict) and NoDecode not in metadata  # NoDecode: read as text
