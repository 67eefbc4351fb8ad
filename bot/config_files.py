"""Reading the operator's configuration files as people save them.

A table written as a value (``llm = "x"`` for ``[llm]``) is refused here, naming the file and the key:
pydantic-settings merges the sources before validating, and a ``MEMBOT_LLM__MODEL`` variable (or .env
line) then replaced the string with its own table, so the bad line passed without a word.

Editors on Windows (Notepad, and others when told to) start a UTF-8 file with a byte-order mark. The
TOML parser refuses it as "Invalid statement (at line 1, column 1)", pointing at a character no editor
shows, so a valid file stopped the bot. A file in another encoding (Latin-1, say) is refused with its
name and line, not with a codec's message that names no file.
"""

from __future__ import annotations

import json
import logging
import re
import tomllib
from collections.abc import Iterator, Mapping
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic_settings import BaseSettings, TomlConfigSettingsSource
from pydantic_settings.sources import DEFAULT_PATH, PathType

from bot.errors import ConfigError


def read_text_file(path: Path | Traversable, what: str) -> str:
    """The UTF-8 text of ``path`` (the TOML file, ``models_file``), without a leading
    byte-order mark; :class:`ConfigError` naming the file and the line when it is not UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        byte = data[exc.start : exc.start + 1].hex()
        raise ConfigError(
            f"{what} {path} is not UTF-8 text (line {line} has the byte 0x{byte}): save it as UTF-8"
        ) from None


class TomlSource(TomlConfigSettingsSource):
    """pydantic-settings' TOML source, reading the file with :func:`read_text_file` and refusing a
    table written as a value (see :func:`misshapen_tables`)."""

    def __init__(self, settings_cls: type[BaseSettings], toml_file: PathType | None = DEFAULT_PATH) -> None:
        super().__init__(settings_cls, toml_file=toml_file)
        bad = list(misshapen_tables(settings_cls, self.toml_data))
        if bad:
            lines = (
                f"  - `{key}` in {self.toml_file_path} is {kind} where a table belongs: write [{key}] and "
                "put its settings on the lines below it, or remove the line"
                for key, kind in bad
            )
            raise ConfigError("invalid configuration:\n" + "\n".join(lines))

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        return tomllib.loads(read_text_file(file_path, "the config file"))


def misshapen_tables(
    model: type[BaseModel], data: Mapping[str, Any], path: str = ""
) -> Iterator[tuple[str, str]]:
    """(the dotted key, what it holds instead) for every key of ``data`` (a TOML file's content, or one
    of its tables) that holds a plain value where ``model`` wants a table. What it holds is told by its
    kind, never by its value: a token may have been pasted there."""
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is not None:  # (an unknown key is pydantic's to refuse, with a "did you mean")
            yield from _misshapen(field.annotation, value, f"{path}{_toml_key(key)}")


def _misshapen(annotation: Any, value: Any, dotted: str) -> Iterator[tuple[str, str]]:
    table = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    if table is None and get_origin(annotation) is not dict:
        return  # a plain setting: pydantic checks its value
    if not isinstance(value, dict):
        yield dotted, _kind(value)
    elif table is not None:
        yield from misshapen_tables(table, value, f"{dotted}.")
    else:  # a table keyed by id, such as telegram.groups: each of its values may be a table too
        for name, item in value.items():
            yield from _misshapen(get_args(annotation)[-1], item, f"{dotted}.{_toml_key(name)}")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "a date or time"  # what else TOML has


class DotenvLines(logging.Filter):
    """python-dotenv's warning about a ``.env`` line it cannot parse, reworded to name the file and the
    fix, and given once per file and line.

    It said "python-dotenv could not parse statement starting at line 2": no file, no fix, and once per
    read of the file (``membot config`` reads it twice). The line is ignored either way: the file may be
    shared with other programs (README), so it is not refused. Set :attr:`file` before a read.
    """

    def __init__(self) -> None:
        super().__init__()
        self.file: Path | None = None
        self._told: set[tuple[Path | None, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        found = re.search(r"line (\d+)", record.getMessage())
        if found is None:
            return True
        told = (self.file, found.group(1))
        if told in self._told:
            return False
        self._told.add(told)
        record.msg = 'ignored line %s of %s: it is not KEY=value (quote a value with spaces: KEY="a b")'
        record.args = (found.group(1), self.file if self.file is not None else ".env")
        return True


DOTENV_LINES = DotenvLines()


def watch_dotenv(env_file: Path | None) -> None:
    """Reword python-dotenv's warnings about ``env_file``, read next (see :class:`DotenvLines`)."""
    DOTENV_LINES.file = env_file.resolve() if env_file is not None else None
    logging.getLogger("dotenv.main").addFilter(DOTENV_LINES)  # (the same filter is added only once)
