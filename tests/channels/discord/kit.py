"""Shared set-up for the Discord channel tests: the real discord.py against the fake Discord, through the
real dispatcher, pipeline and fake LLM."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from bot.app import Core, build_core
from bot.commands import CommandCall, SessionControl
from bot.config import load_settings
from bot.pairing import PAIRING_FILE, PairingStore
from channels.discord import DiscordChannel
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.llm_server import FakeLLMServer


async def _commands_for_tests(call: CommandCall, control: SessionControl) -> str:
    """Stand-ins for /status, /compact and /new until their real handlers are registered by the app."""
    return f"{call.name} done ({call.args or 'no args'}) for {call.session_id}"


@contextlib.asynccontextmanager
async def running_bot(
    fake: FakeDiscord,
    llm: FakeLLMServer,
    workspace: Path,
    section: dict[str, Any],
    *,
    vision: bool = True,
    before_start: Callable[[Core, DiscordChannel], None] | None = None,
    llm_settings: dict[str, Any] | None = None,
    dispatcher: dict[str, Any] | None = None,
    clock: Callable[[], float] = time.monotonic,
    storage_retry: tuple[float, float] = (0.5, 30.0),
) -> AsyncIterator[tuple[Core, DiscordChannel]]:
    """The whole bot on ``workspace`` with its Discord channel started against ``fake``; stopped on exit,
    so a test can start it again on the same workspace (a restart). ``llm_settings`` and ``dispatcher``
    add to (or override) those settings; ``clock`` is the channel's (share the fake's to let time pass);
    ``storage_retry``: the channel's first and longest wait for storage."""
    overrides = {
        "workspace": workspace,
        "llm": {
            "model": "gpt-4.1-mini",
            "openai": {"base_url": llm.openai_base_url, "api_key": "sk-test-123456"},
            **(llm_settings or {}),
        },
        "dispatcher": dispatcher or {},
        "discord": {
            "token": fake.token,
            "api_base": fake.api_base,
            "gateway_url": fake.gateway_url,
            "send_retry_delay": 0.01,
            **section,
        },
    }
    settings = await asyncio.to_thread(load_settings, None, env_file=None, overrides=overrides)
    async with build_core(settings) as core:
        for name in ("status", "compact", "new"):
            if name not in dict(core.commands.commands):
                core.commands.add(name, f"the {name} command", _commands_for_tests)
        channel = DiscordChannel(
            settings.discord,
            core.dispatcher.submit,
            pairing=PairingStore(workspace / PAIRING_FILE),
            commands=core.commands.commands,
            vision_supported=lambda: vision,
            state_dir=workspace / "state",
            guild_ready_timeout=0.05,
            clock=clock,
            storage_retry_delay=storage_retry[0],
            storage_retry_max_delay=storage_retry[1],
        )
        core.dispatcher.attach(channel)
        if before_start is not None:
            before_start(core, channel)
        await channel.start()
        try:
            yield core, channel
        finally:
            await channel.stop()
