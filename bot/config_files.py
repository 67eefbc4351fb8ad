"""Reading the operator's configuration files as people save them.

Editors on Windows (Notepad, and others when told to) start a UTF-8 file with a byte-order mark. The
TOML parser refuses it as "Invalid statement (at line 1, column 1)", pointing at a character no editor
shows, so a valid file stopped the bot. A file in another encoding (Latin-1, say) is refused with its
name and line, not with a codec's message that names no file.
"""

from __future__ import annotations

import logging
import re
import tomllib
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from pydantic_settings import TomlConfigSettingsSource

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
    """pydantic-settings' TOML source, reading the file with :func:`read_text_file`."""

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        return tomllib.loads(read_text_file(file_path, "the config file"))


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
