"""Which tools are offered where, the built-in set, and the package's public surface."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

import bot.tools
from bot.app import build_core
from bot.config import ToolSettings, load_settings
from bot.errors import ConfigError
from bot.tools import ToolRegistry, builtin_tools


def names(registry: ToolRegistry, channel: str) -> list[str]:
    return [spec.name for spec in registry.specs(channel)]


async def test_defaults_enable_the_safe_tools_and_not_shell(tmp_path: Path) -> None:
    settings = ToolSettings()
    async with httpx.AsyncClient() as http:
        tools = builtin_tools(settings, workspace=tmp_path, timezone="UTC", http=http)
    registry = ToolRegistry(tools, settings)
    assert names(registry, "telegram") == ["files", "web_fetch", "time"]  # memory needs the service
    assert registry.get("shell", "telegram") is None


async def test_shell_needs_its_switch_and_channels_filter(tmp_path: Path) -> None:
    settings = ToolSettings(
        enabled=["files", "time", "web_fetch"],
        shell_enabled=True,
        channel_allow={"discord": ["time", "shell"]},
        channel_deny={"telegram": ["web_fetch", "shell"]},
    )
    async with httpx.AsyncClient() as http:
        registry = ToolRegistry(
            builtin_tools(settings, workspace=tmp_path, timezone="UTC", http=http), settings
        )
    assert names(registry, "cli") == ["files", "web_fetch", "time", "shell"]
    assert names(registry, "discord") == ["time", "shell"]
    assert names(registry, "telegram") == ["files", "time"]
    assert registry.get("web_fetch", "telegram") is None


async def test_every_spec_is_an_object_schema(tmp_path: Path) -> None:
    settings = ToolSettings(shell_enabled=True)
    async with httpx.AsyncClient() as http:
        registry = ToolRegistry(
            builtin_tools(settings, workspace=tmp_path, timezone="UTC", http=http), settings
        )
    for spec in registry.specs("cli"):
        assert spec.parameters["type"] == "object" and spec.description
        assert set(spec.parameters.get("required", ())) <= set(spec.parameters["properties"])


def test_public_surface() -> None:
    public = {n for n in vars(bot.tools) if not n.startswith("_")} - {
        "base", "builtin", "clock", "confine", "files", "html_text", "journal", "memory", "netguard", "paging", "shell", "web_fetch", "workspace_files"
    }  # fmt: skip
    assert public == set(bot.tools.__all__)


async def test_a_misspelled_tool_name_stops_the_start_with_the_names_there_are(tmp_path: Path) -> None:
    """It used to leave the tool off without a word, where any other misspelled setting is an error."""
    overrides = {
        "workspace": tmp_path / "ws",
        "llm": {"openai": {"api_key": "sk-test"}},
        "tools": {"enabled": ["memroy", "time"], "channel_deny": {"telegram": ["web_fech"]}},
    }
    settings = await asyncio.to_thread(load_settings, None, env_file=None, overrides=overrides)
    with pytest.raises(ConfigError) as info:
        async with build_core(settings):
            pass
    assert "tools.enabled names 'memroy'; tools.channel_deny.telegram names 'web_fech'" in str(info.value)
    assert "(the tools are files, memory, shell, time, web_fetch)" in str(info.value)
    # Memory off: "memory" (enabled by default) still names a tool.
    quiet = await asyncio.to_thread(
        load_settings, None, env_file=None, overrides={**overrides, "tools": {}, "memory": {"enabled": False}}
    )
    async with build_core(quiet):
        pass
