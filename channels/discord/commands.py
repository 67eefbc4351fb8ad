"""Slash commands on Discord: registering membot's chat commands and reading an interaction back as text.

The commands (``/status``, ``/new``, ...) are registered globally with one bulk overwrite, and only when
the set differs from what this bot last registered: a hash of the payload is kept in the state
directory, because Discord rate-limits command registration and every overwrite re-syncs clients. The
channel registers them in the background at its start, waiting out an outage (:func:`register_commands`).
An invocation arrives as an interaction and is handed on as the same text a user could have typed
(``/compact 5``), so the command router treats both forms alike.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import discord
import structlog

from bot.retry import Backoff, retry
from bot.storage import atomic_write_text_async, ensure_private_dir
from channels.discord.outbound import TRANSIENT, describe

log = structlog.get_logger(__name__)

STATE_FILE = "discord_commands.json"
_COMMANDS_RETRY_CAP = 300.0  # seconds between tries at most, while Discord is out
_NAME = re.compile(r"^[-_a-z0-9]{1,32}$")
_INTEGER = 4

# Options the command picker should offer; commands not listed take no arguments.
_OPTIONS: dict[str, list[dict[str, Any]]] = {
    "compact": [
        {
            "type": _INTEGER,
            "name": "keep",
            "description": "How many recent messages to keep (default 10)",
            "required": False,
            "min_value": 1,
            "max_value": 100,
        }
    ],
}


def command_payload(commands: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The bulk-overwrite body for ``(name, description)`` pairs; names Discord would refuse are skipped."""
    payload: list[dict[str, Any]] = []
    for name, description in commands:
        name = name.lower()
        if not _NAME.match(name):
            log.warning("discord_command_name_invalid", command=name)
            continue
        entry: dict[str, Any] = {
            "type": 1,
            "name": name,
            "description": (description or name)[:100],
            "contexts": [0, 1, 2],  # guilds, the bot's DMs, other DMs
            "integration_types": [0],
        }
        if name in _OPTIONS:
            entry["options"] = _OPTIONS[name]
        payload.append(entry)
    return payload


def _digest(application_id: int, payload: list[dict[str, Any]]) -> str:
    canonical = json.dumps({"application": application_id, "commands": payload}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _read_digest(path: Path) -> str | None:
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["hash"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


async def sync_commands(client: discord.Client, commands: list[tuple[str, str]], state_dir: Path) -> bool:
    """Register the commands if they changed since the last sync; ``True`` if Discord was called."""
    application_id = client.application_id
    if application_id is None:
        return False
    payload = command_payload(commands)
    digest = _digest(application_id, payload)
    path = state_dir / STATE_FILE
    if await asyncio.to_thread(_read_digest, path) == digest:
        return False
    await client.http.bulk_upsert_global_commands(application_id, payload)
    await asyncio.to_thread(ensure_private_dir, state_dir)
    await atomic_write_text_async(
        path, json.dumps({"hash": digest, "commands": [c["name"] for c in payload]})
    )
    log.info("discord_commands_registered", commands=[c["name"] for c in payload])
    return True


async def register_commands(
    client: Callable[[], discord.Client], commands: list[tuple[str, str]], state_dir: Path, retry_delay: float
) -> None:
    """Register the slash commands, in the background. An outage (5xx, the network) is waited out
    with backoff until the channel stops: given up, users saw no commands until the next start."""
    backoff = Backoff(retry_delay, _COMMANDS_RETRY_CAP)

    def again(exc: Exception, tries: int, delay: float) -> None:
        log.warning("discord_commands_retry", attempt=tries, retry_in=delay, error=describe(exc))

    try:
        await retry(
            lambda: sync_commands(client(), commands, state_dir),
            retry_if=lambda exc, tries: isinstance(exc, TRANSIENT),  # the same PUT: idempotent
            wait=lambda exc, tries: backoff(tries - 1),
            on_retry=again,
        )
    except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
        log.warning("discord_commands_not_registered", error=describe(exc))


def interaction_text(interaction: discord.Interaction) -> str | None:
    """``/name arg ...`` for a slash-command interaction; ``None`` for any other interaction."""
    if interaction.type is not discord.InteractionType.application_command:
        return None
    data: Any = interaction.data or {}
    name = data.get("name")
    if not name:
        return None
    values = [str(option.get("value", "")) for option in data.get("options") or [] if "value" in option]
    return " ".join([f"/{name}", *values])
