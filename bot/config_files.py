"""Reading the operator's configuration files as people save them.

Editors on Windows (Notepad, and others when told to) start a UTF-8 file with a byte-order mark. The
TOML parser refuses it as "Invalid statement (at line 1, column 1)", pointing at a character no editor
shows, so a valid file stopped the bot. A file in another encoding (Latin-1, say) is refused with its
name and line, not with a codec's message that names no file.
"""

from __future__ import annotations

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
