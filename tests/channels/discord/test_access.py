"""Discord access rules and the slash-command payload, as plain values."""

from __future__ import annotations

from bot.config import DiscordSettings
from channels.discord.commands import command_payload
from channels.discord.inbound import DiscordAccess, Place

DM = Place("10")
GENERAL = Place("20", guild_id="1")
THREAD = Place("21", guild_id="1", parent_id="20")
ELSEWHERE = Place("30", guild_id="2")


def access(**settings: object) -> DiscordAccess:
    return DiscordAccess(DiscordSettings.model_validate(settings))


def test_empty_allowlists_admit_nobody() -> None:
    rules = access()
    assert not any(rules.admits("7", place) for place in (DM, GENERAL, THREAD, ELSEWHERE))


def test_allowed_users_are_heard_anywhere_and_ids_match_exactly() -> None:
    rules = access(allowed_users=["7"])
    assert rules.admits("7", DM) and rules.admits("7", ELSEWHERE)
    assert not rules.admits("77", DM)


def test_guild_and_channel_allowlists_cover_threads_but_never_dms() -> None:
    by_channel = access(allowed_channels=["20"])
    assert by_channel.admits("8", GENERAL) and by_channel.admits("8", THREAD)
    assert not by_channel.admits("8", ELSEWHERE) and not by_channel.admits("8", DM)
    by_guild = access(allowed_guilds=["1"])
    assert by_guild.admits("8", THREAD) and not by_guild.admits("8", ELSEWHERE)
    assert access(allowed_guilds=["*"]).admits("8", ELSEWHERE) and not access(allowed_guilds=["*"]).admits(
        "8", DM
    )


def test_mention_overrides_thread_then_channel_then_guild() -> None:
    rules = access(mention_overrides={"1": False, "20": True})
    assert rules.requires_mention(GENERAL)  # the channel beats its guild
    assert rules.requires_mention(THREAD)  # a thread follows its parent channel
    assert not access(mention_overrides={"21": False, "20": True}).requires_mention(THREAD)
    assert not rules.requires_mention(DM)
    assert access(require_mention=True).requires_mention(ELSEWHERE)
    assert not access(require_mention=False).requires_mention(ELSEWHERE)


def test_command_payload_skips_names_discord_refuses() -> None:
    payload = command_payload([("status", "Show status"), ("Bad Name", "x"), ("compact", "c" * 150)])
    assert [c["name"] for c in payload] == ["status", "compact"]
    assert len(payload[1]["description"]) == 100 and payload[1]["options"][0]["type"] == 4
