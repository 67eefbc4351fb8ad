"""Telegram's command menu: registering membot's chat commands, only when they changed.

The menu (``/status``, ``/new``, ...) is set with one ``setMyCommands`` at start-up, and only when it
differs from what this bot last registered: a hash of the bot's id and the menu is kept in the state
directory, so a restart costs no Bot API call. Names are lowered; a name Telegram would refuse (over 32
characters, or anything but letters, digits and ``_``) and a command without a description are left out.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
from telegram import Bot, BotCommand

from bot.storage import atomic_write_text_async
from channels.telegram.outbound import TelegramOutbox

log = structlog.get_logger(__name__)

STATE_FILE = "telegram_commands.json"
_NAME = re.compile(r"[a-z0-9_]{1,32}")


async def sync_commands(
    bot: Bot, commands: Sequence[tuple[str, str]], state_dir: Path, outbox: TelegramOutbox
) -> None:
    """Register ``(name, description)`` pairs as the menu, unless that is what was registered last time.

    The request goes through ``outbox`` (its retries); failing to save the hash only costs registering
    again at the next start."""
    menu = [
        BotCommand(name.lower(), description[:256])
        for name, description in commands
        if _NAME.fullmatch(name.lower()) and description
    ]
    payload = json.dumps([bot.id, [(c.command, c.description) for c in menu]])
    digest = hashlib.sha256(payload.encode()).hexdigest()
    path = state_dir / STATE_FILE
    stored = await asyncio.to_thread(_read_json, path)
    if stored.get("hash") == digest:
        return
    await outbox.call(lambda: bot.set_my_commands(menu), what="setMyCommands")
    log.info("telegram_commands_registered", count=len(menu))
    try:
        await atomic_write_text_async(path, json.dumps({"hash": digest}) + "\n")
    except OSError as exc:  # only costs registering again at the next start
        log.warning("telegram_commands_hash_not_saved", error=exc.strerror or str(exc))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
