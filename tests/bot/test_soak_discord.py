"""Soak: the real ``membot run`` killed (SIGKILL) at random points while Discord users keep writing.

Two users write to the bot in their DMs, and three people mention it in two channels of an allowed
server ("general", where it talked before the soak, and "random", where it never did until then), with
now and then some chatter there that does not mention it (never answered). They keep writing whether
the bot is up, starting, or down. Discord keeps nothing for a bot that is down (the fake neither: the
gateway is closed, and a new session replays nothing), so what was written meanwhile reaches the bot
only through its catch-up of the channels' history (channels/discord/catch_up.py). The bot is started,
killed after a random delay (during start-up, during the catch-up, while serving, or after its gateway
connection dropped and was resumed or replaced by a new session), started again, a few times; a last
run drains everything and stops gracefully. Then, for every message a user sent:

- lost: no answer carries it (a mention, or any DM; in-flight turns and unsent answers included);
- duplicated: more than one answer carries it;
- answered chatter: an answer carries a guild message that did not mention the bot;
- corrupt: any JSON or JSON-lines file of the workspace that does not parse, or a session moved aside.

A first run, stopped gracefully, lets the bot talk once in each DM and in "general" before the kills:
a DM from a user the bot never talked with cannot be read back while it is down (a bot cannot list its
DMs; README, "Nothing lost"), and the first start reads no channel it never talked in.

The randomness is seeded (``MEMBOT_SOAK_SEED`` replays a run); the seed and the counts are printed.
The exception the Telegram soak (tests/bot/test_soak.py) allows is allowed here too: an answer Discord
accepted just before the kill, its done mark not on disk yet, is sent again on the next start; on
Discord the part sent again carries the first one's nonce, which Discord enforces, so it is expected to
be dropped there and none to be counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.bot.membot_service import Service, membot_run
from tests.bot.test_soak import TOKEN, corrupt_files, echo_new_user_messages
from tests.fakes.discord_server import FakeDiscord, FakeUser, Guild, Json
from tests.fakes.llm_server import FakeLLMServer

KILLS = 6
KILL_PHASE = 32.0  # seconds at most for the kill rounds
MAX_MESSAGES = 200
EDGE = 2.0  # seconds from the platform's record of a send to a kill that may repeat it
# A word of a guild message that does not mention the bot: it must never reach an answer.
CHATTER = "idle"


class TimedDiscord(FakeDiscord):
    """The Discord fake, also noting when each bot message was recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.sent_at: dict[str, float] = {}

    def _bot_message(self, channel_id: str, body: Json, **extra: Any) -> Json:
        message = super()._bot_message(channel_id, body, **extra)
        self.sent_at[message["id"]] = time.monotonic()
        return message


@dataclass(frozen=True, slots=True)
class World:
    """Who writes where: two DMs, and two channels of an allowed server."""

    discord: TimedDiscord
    alice: FakeUser  # allowed everywhere (DMs too)
    bob: FakeUser  # allowed everywhere (DMs too)
    carol: FakeUser  # heard only in the allowed server
    guild: Guild
    dms: dict[str, FakeUser]  # DM channel -> its user
    general: str  # the bot talks here before the soak
    random: str  # the bot first talks here during the soak

    @classmethod
    def build(cls, discord: TimedDiscord) -> World:
        guild = discord.add_guild("home")
        alice, bob, carol = discord.user("alice"), discord.user("bob"), discord.user("carol")
        dms = {discord.dm_channel(): alice, discord.dm_channel(): bob}
        general, random_ = discord.add_channel(guild, "general"), discord.add_channel(guild, "random")
        return cls(discord, alice, bob, carol, guild, dms, general, random_)

    def env(self) -> dict[str, str]:
        fake = self.discord
        return {
            "MEMBOT_TERMINAL__ENABLED": "false",
            "MEMBOT_DISCORD__TOKEN": fake.token,
            "MEMBOT_DISCORD__API_BASE": fake.api_base,
            "MEMBOT_DISCORD__GATEWAY_URL": fake.gateway_url,
            "MEMBOT_DISCORD__ALLOWED_USERS": f'["{self.alice.id}", "{self.bob.id}"]',
            "MEMBOT_DISCORD__ALLOWED_GUILDS": f'["{self.guild.id}"]',
        }

    async def dm(self, channel: str, text: str) -> None:
        await self.discord.user_message(channel_id=channel, author=self.dms[channel], content=text)

    async def mention(self, channel: str, author: FakeUser, text: str) -> None:
        bot = self.discord.bot
        await self.discord.user_message(
            channel_id=channel,
            author=author,
            content=f"{bot.mention} {text}",
            guild=self.guild,
            mentions=(bot,),
        )

    async def chatter(self, channel: str, author: FakeUser, text: str) -> None:
        await self.discord.user_message(channel_id=channel, author=author, content=text, guild=self.guild)


async def write_messages(
    world: World, rng: random.Random, sent: dict[str, str], chatter: set[str], stop: asyncio.Event
) -> None:
    """Users write, one message every 0.1 to 0.4 s, until ``stop`` or ``MAX_MESSAGES``: ``sent`` maps
    each token to be answered to its chat, ``chatter`` holds the tokens that must not be."""
    dms = list(world.dms)
    people = (world.alice, world.bob, world.carol)
    while not stop.is_set() and len(sent) + len(chatter) < MAX_MESSAGES:
        token = f"tok{len(sent) + len(chatter):05d}"
        roll = rng.random()
        if roll < 0.4:
            channel = rng.choice(dms)
            sent[token] = channel
            await world.dm(channel, f"message {token} for you")
        else:
            channel = world.general if roll < 0.75 else world.random
            author = rng.choice(people)
            if rng.random() < 0.15:
                chatter.add(token)
                await world.chatter(channel, author, f"{CHATTER} {token} among us")
            else:
                sent[token] = channel
                await world.mention(channel, author, f"message {token} for you")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(rng.uniform(0.1, 0.4)):
                await stop.wait()


def answered(discord: FakeDiscord) -> set[str]:
    return {t for m in discord.bot_messages for t in TOKEN.findall(m["content"])}


async def warm_up(world: World, workspace: Path, llm: FakeLLMServer, sent: dict[str, str]) -> str:
    """The bot talks once in each DM and in "general", then stops gracefully (see the module doc);
    returns its log."""
    async with membot_run(workspace, llm, **world.env()) as service:
        for n, channel in enumerate(world.dms):
            sent[f"tok9{n:04d}"] = channel
            await world.dm(channel, f"hello tok9{n:04d}")
        sent["tok99999"] = world.general
        await world.mention(world.general, world.carol, "hello tok99999")
        await world.discord.wait_until(lambda: set(sent) <= answered(world.discord), timeout=30)
        return (await _stop(service)).stderr


async def until_the_kill(service: Service, discord: FakeDiscord, rng: random.Random) -> str:
    """Let a run go on until a random moment to kill it at; returns what the moment was."""
    roll = rng.random()
    if roll < 0.15:  # during start-up: recovery, login, the gateway's READY
        await asyncio.sleep(rng.uniform(0.3, 3.5))
        return "start-up"
    if roll < 0.3:  # while the catch-up reads the chats and hands their messages over
        with contextlib.suppress(TimeoutError):
            await service.wait_log("discord_catch_up_planned", timeout=30)
        await asyncio.sleep(rng.uniform(0.0, 0.2))
        return "catch-up"
    # Mostly while serving: turns running, answers being saved and sent. Now and then the connection
    # drops meanwhile: the client RESUMEs and Discord replays what it missed, or (a session Discord
    # no longer knows) it IDENTIFYs again, 5 s later as discord.py does, and the catch-up reads the
    # gap in the same process.
    with contextlib.suppress(TimeoutError):
        await service.wait_log("discord_started", timeout=30)
    if roll < 0.5:
        await asyncio.sleep(rng.uniform(0.0, 1.5))
        fresh = rng.random() < 0.5
        if fresh:
            discord.invalidate_session()
        sessions = (len(discord.identifies), discord.resumes)
        await discord.drop()
        with contextlib.suppress(TimeoutError):
            await discord.wait_until(
                lambda: discord.connected and (len(discord.identifies), discord.resumes) != sessions,
                timeout=30,
            )
        await asyncio.sleep(rng.uniform(0.0, 1.5))
        return "drop, new session" if fresh else "drop, resumed"
    await asyncio.sleep(rng.uniform(0.1, 3.0))
    return "serving"


async def test_random_kills_while_discord_users_write_lose_nothing_and_repeat_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("MEMBOT_SOAK_SEED") or random.SystemRandom().randrange(1, 10**6))
    # One generator each, so the users' messages and the kills replay alike however the runs interleave.
    rng, rounds = random.Random(f"{seed}-users"), random.Random(f"{seed}-kills")
    print(f"discord soak seed {seed} (MEMBOT_SOAK_SEED={seed} replays it)")
    workspace = tmp_path / "ws"
    sent: dict[str, str] = {}  # token -> the chat it was written in
    chatter: set[str] = set()
    kills: list[float] = []
    starts: list[float] = []  # when each run began: between a kill and the next start the bot is down
    in_flight = serving = 0
    kinds: Counter[str] = Counter()
    stderr: list[str] = []
    async with FakeLLMServer() as llm, TimedDiscord() as discord:
        world = World.build(discord)
        llm.responder = echo_new_user_messages(random.Random(f"{seed}-model"))
        stderr.append(await warm_up(world, workspace, llm, sent))
        stop = asyncio.Event()
        writer = asyncio.create_task(write_messages(world, rng, sent, chatter, stop))
        phase_end = time.monotonic() + KILL_PHASE
        while len(kills) < KILLS and time.monotonic() < phase_end:
            starts.append(time.monotonic())
            async with membot_run(workspace, llm, ready=None, **world.env()) as service:
                kinds[await until_the_kill(service, discord, rounds)] += 1
                kills.append(time.monotonic())
                in_flight += llm.in_flight > 0
                serving += service.logged("discord_started")
                await service.kill()
                stderr.append(service.stderr)
            await asyncio.sleep(rounds.uniform(0.0, 1.0))  # down for a moment; users keep writing
        stop.set()
        await writer
        starts.append(time.monotonic())
        async with membot_run(workspace, llm, **world.env()) as service:
            with contextlib.suppress(TimeoutError):
                await discord.wait_until(lambda: set(sent) <= answered(discord), timeout=40)
            final = await _stop(service)
            stderr.append(final.stderr)
        carriers: dict[str, list[str]] = defaultdict(list)
        by_id = {m["id"]: m for m in discord.bot_messages}
        for message in discord.bot_messages:
            for token in set(TOKEN.findall(message["content"])):
                carriers[token].append(message["id"])
        lost = sorted(t for t in sent if not carriers.get(t))
        heard_chatter = sorted(t for t in chatter if carriers.get(t))
        wrong_chat = sorted(
            t
            for t, ids in carriers.items()
            if t in sent and any(by_id[i]["channel_id"] != sent[t] for i in ids)
        )
        # A send the platform recorded while the bot was down was written before the kill: the fake runs
        # in this test's event loop and may read a request only after SIGKILL.
        downs = list(zip(kills, starts[1:], strict=True))
        edge, duplicated = [], []
        for token, ids in carriers.items():
            first = by_id[ids[0]]
            for again in ids[1:]:
                resent = by_id[again]["content"] == first["content"]
                at = discord.sent_at[first["id"]]
                killed_after = any(k - EDGE <= at <= back for k, back in downs)
                (edge if resent and killed_after else duplicated).append(token)
    corrupt = await asyncio.to_thread(corrupt_files, workspace)
    unreadable = [line for text in stderr for line in text.splitlines() if "_unreadable" in line]
    bounded = _events(stderr, "discord_catch_up_limit_reached")
    caught_up = sum(e["handed_over"] for e in _events(stderr, "discord_caught_up"))
    ignored = len(_events(stderr, "duplicate_message_ignored"))
    posts = Counter(
        (r.path, r.body["nonce"])
        for r in discord.requests
        if r.method == "POST" and r.path.endswith("/messages") and r.body and r.body.get("nonce")
    )
    dropped = sum(n - 1 for n in posts.values())
    summary = (
        f"discord soak seed {seed}: {len(sent)} messages to answer and {len(chatter)} of chatter in "
        f"{len(world.dms)} DMs and 2 server channels, {len(kills)} SIGKILLs ({dict(kinds)}; {serving} while serving, "
        f"{in_flight} with a model call in flight), {len(discord.identifies)} gateway sessions, "
        f"{discord.resumes} resumed, {caught_up} handed over from the history "
        f"({ignored} of them, or live ones, known already), "
        f"{len(discord.bot_messages)} answers ({dropped} sent again and dropped by their nonce); lost {len(lost)}, "
        f"duplicated {len(duplicated)}, resent at the kill edge {len(edge)}, wrong chat {len(wrong_chat)}, "
        f"chatter answered {len(heard_chatter)}, corrupt {len(corrupt)}"
    )
    print(summary)
    assert len(kills) >= 3, summary
    # The soak means to test durability, not the catch-up's bound: no chat may miss more than it reads.
    assert not bounded, f"{summary}\na catch-up hit discord.catch_up_max_messages: {bounded}"
    assert not lost, f"{summary}\nlost: {lost}"
    assert not duplicated, f"{summary}\nduplicated: {duplicated}\n" + "\n".join(
        _carriers(token, carriers[token], discord, kills) for token in duplicated
    )
    assert not wrong_chat and not heard_chatter and not corrupt and not unreadable, (
        f"{summary}\n{wrong_chat} {heard_chatter} {corrupt} {unreadable}"
    )


def _events(stderr: list[str], name: str) -> list[dict[str, Any]]:
    """The JSON log lines of the runs named ``name``."""
    found = []
    for text in stderr:
        for line in text.splitlines():
            if f'"event": "{name}"' in line:
                with contextlib.suppress(ValueError):
                    found.append(json.loads(line))
    return found


def _carriers(token: str, ids: list[str], discord: TimedDiscord, kills: list[float]) -> str:
    """Each answer that carried ``token``: when the platform recorded it, the kills around it, its text."""
    lines = [f"{token}:"]
    for i in ids:
        at = discord.sent_at.get(i, 0.0)
        near = sorted(round(k - at, 2) for k in kills if -5 <= k - at <= 10)
        text = discord.messages[i]["content"]
        lines.append(f"  message {i} at {at:.2f}, kills at {near} s from it: {text[:200]!r}")
    return "\n".join(lines)


async def _stop(service: Service) -> Service:
    service.process.send_signal(signal.SIGTERM)
    code, _ = await service.finish()
    assert code == 0, service.stderr[-3000:]
    return service
