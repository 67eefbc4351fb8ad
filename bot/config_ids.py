"""Ids in settings: user, chat, group and channel ids read as exact strings, however they were written."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator
from pydantic_settings import NoDecode


def _ids(value: Any) -> Any:
    """User, chat, group and channel ids as strings, however they were written.

    ``[12345]`` in TOML or ``'[12345]'`` in the environment (numbers), a single id, or a comma-separated
    ``12345,67890`` all become ``["12345", ...]``; ids are compared as exact strings later. Anything
    else (a username, a value with the quotes ``docker run --env-file`` keeps) is refused: it would
    match no one, and the allowlist would look set while it denied everyone.
    """
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f'not a valid JSON list ({exc.msg}); write it like ["12345", "67890"]'
                ) from None
        else:
            value = [part.strip() for part in text.replace(",", " ").split() if part.strip()]
    if isinstance(value, int) and not isinstance(value, bool):
        return [str(value)]
    if isinstance(value, list | tuple):
        value = [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        for v in value:
            if isinstance(v, str) and v.strip() and not _ID.fullmatch(v.strip()):
                raise ValueError(_not_an_id(v))
        # Kept as the platform sends them: an id compared as written (" 42") would match no one.
        value = [v.strip() if isinstance(v, str) else v for v in value]
        value = [v for v in value if v != ""]
    return value


_ID = re.compile(r"\*|-?[0-9]+")  # what Telegram and Discord send as ids, and "*" for everyone


def _not_an_id(text: str) -> str:
    """Why ``text`` cannot be an id: it would match no one, so the allowlist would look set and deny all."""
    said = f'{text!r} is not an id: ids are whole numbers (or "*" for everyone)'
    if text.startswith(("'", '"')):  # `docker run --env-file` keeps the quotes a shell would remove
        return f"{said}; remove the quotes around the value (docker run --env-file keeps them)"
    return f"{said}, as the platform sends them, not names"


IdList = Annotated[list[str], NoDecode, BeforeValidator(_ids)]
"""A list of ids; see :func:`_ids` for what is accepted."""


def _no_wildcard(ids: list[str]) -> list[str]:
    if "*" in ids:  # (ids come stripped: _ids)
        raise ValueError(
            '"*" is not allowed here: it would make everyone an admin; list the operators\' own user ids'
        )
    return ids


AdminIdList = Annotated[list[str], NoDecode, BeforeValidator(_ids), AfterValidator(_no_wildcard)]
"""A list of ids that names people one by one ("*" refused): the admins of a channel."""
