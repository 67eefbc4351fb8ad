"""Connecting discord.py to Discord: where it connects to, and why a start-up failed in words that say what
to fix (the library's own errors name no setting and no portal page)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import discord
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

from bot.errors import ChannelError
from channels.discord.outbound import describe


def point_library_at(api_base: str | None, gateway_url: str | None) -> Callable[[], None]:
    """Aim discord.py at other endpoints (tests, proxies); returns the undo.

    The library keeps both addresses as class attributes, so the undo runs in ``stop``.
    """
    old_base, old_gateway = Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    if api_base:
        Route.BASE = api_base.rstrip("/")
    if gateway_url:
        DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway_url)

    def restore() -> None:
        Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = old_base, old_gateway

    return restore


def startup_error(gateway: asyncio.Task[None], timeout: float) -> ChannelError:
    """Why the gateway did not become ready, in words that say what to fix."""
    if not gateway.done():
        return ChannelError(f"Discord did not become ready within {timeout:g} s (discord.start_timeout)")
    return gateway_error(gateway.exception() if not gateway.cancelled() else None)


def gateway_error(exc: BaseException | None) -> ChannelError:
    """Why discord.py's gateway gave up, at the start or while serving: a token reset or the intent
    turned off in the developer portal is refused at the next IDENTIFY (close codes 4004 and 4014)."""
    if isinstance(exc, discord.PrivilegedIntentsRequired):
        return ChannelError(
            "Discord refused the message-content intent. In the Discord developer portal open your "
            "application → Bot → Privileged Gateway Intents, enable MESSAGE CONTENT INTENT, then restart."
        )
    if isinstance(exc, discord.LoginFailure) or (
        isinstance(exc, discord.ConnectionClosed) and exc.code == AUTHENTICATION_FAILED
    ):
        return ChannelError("Discord rejected the bot token: check MEMBOT_DISCORD__TOKEN / [discord] token")
    return ChannelError(f"could not connect to Discord: {describe(exc)}")


AUTHENTICATION_FAILED = 4004  # the gateway's close code for a token it refuses
