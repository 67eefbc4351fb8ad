"""A local Discord: REST under ``/api/v10`` and a websocket gateway, for the real discord.py to talk to.

It keeps the rules a bot meets on the real service, so an adapter that breaks them fails a test:
messages over 2000 characters are refused with error 50035, guild messages arrive with empty content
when the IDENTIFY intents lack MESSAGE_CONTENT (unless they mention the bot), a privileged intent the
application was not granted closes the gateway with 4014, rate limits answer 429 with ``retry_after``
and a ``Via`` header, and every JSON answer carries exactly ``Content-Type: application/json``. A
channel can refuse the bot for good with Discord's own error bodies (:meth:`FakeDiscord.refuse_channel`:
``CANNOT_DM``, ``UNKNOWN_CHANNEL``, ``MISSING_ACCESS``, ``MISSING_PERMISSIONS``). Attachments are served
as the CDN does, under their ``url``; a :class:`CdnFile` can state another ``size`` in the message than
the body the CDN sends, and send that body chunked, without ``Content-Length``. A message sent with a
nonce Discord was told to enforce is not posted twice: the first is returned again, until
:meth:`FakeDiscord.forget_nonces` (Discord keeps a nonce for a few minutes). An edit of a message that
was deleted (:meth:`FakeDiscord.delete_message`) gets 404 "Unknown Message". An interaction's token
lasts 15 minutes (``INTERACTION_TOKEN_TTL``, on the fake's ``clock``): a webhook request with an older
one (the answer's edit of the "thinking", a follow-up) gets 401 "Invalid Webhook Token" (50027).

The gateway is one session at a time. Every dispatch gets the next sequence number and is kept, so a
client that drops and RESUMEs receives what it missed, as on the real gateway.

    async with FakeDiscord() as discord_api:
        settings = {"api_base": discord_api.api_base, "gateway_url": discord_api.gateway_url, ...}
        ...start the bot...
        await discord_api.user_message(channel_id=DM, author=alice, content="hi")
        reply = await discord_api.wait_for_bot_message(DM)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import WSMsgType, web

from tests.fakes.file_body import send_body

MESSAGE_CONTENT = 1 << 15
PRIVILEGED_INTENTS = (1 << 1) | (1 << 8) | MESSAGE_CONTENT  # members, presences, message content
CONTENT_LIMIT = 2000
DISCORD_EPOCH_MS = 1_420_070_400_000
INTERACTION_TOKEN_TTL = 15 * 60.0  # seconds an interaction's token is good for, from the interaction
_sequence = itertools.count()
_last = 0

Json = dict[str, Any]

# What Discord answers every request to a channel the bot can no longer reach: (status, code, message).
CANNOT_DM = (403, 50007, "Cannot send messages to this user")
UNKNOWN_CHANNEL = (404, 10003, "Unknown Channel")
MISSING_ACCESS = (403, 50001, "Missing Access")
MISSING_PERMISSIONS = (403, 50013, "Missing Permissions")

VIEW_CHANNEL, SEND_MESSAGES, READ_MESSAGE_HISTORY = 1 << 10, 1 << 11, 1 << 16
BOT_PERMISSIONS = VIEW_CHANNEL | SEND_MESSAGES | READ_MESSAGE_HISTORY  # what an invite usually grants


def snowflake(at: datetime | None = None) -> str:
    """A new id that carries its time, as Discord's do (discord.py reads ``created_at`` from it): now and
    larger than every id before it, or of the moment ``at`` for a message written in the past."""
    global _last
    when = at or datetime.now(UTC)
    value = (int(when.timestamp() * 1000) - DISCORD_EPOCH_MS) << 22 | next(_sequence) % (1 << 22)
    if at is None:
        value = _last = max(value, _last + 1)
    return str(value)


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # Exactly "application/json": discord.py's json_or_text compares the header verbatim.
    return web.Response(
        body=json.dumps(data).encode(),
        status=status,
        headers={"Content-Type": "application/json", **(headers or {})},
    )


@dataclass(frozen=True, slots=True)
class FakeUser:
    id: str
    name: str
    bot: bool = False

    def to_json(self) -> Json:
        return {
            "id": self.id,
            "username": self.name,
            "global_name": self.name,
            "discriminator": "0",
            "avatar": None,
            "bot": self.bot,
        }

    @property
    def mention(self) -> str:
        return f"<@{self.id}>"


@dataclass(slots=True)
class RecordedRequest:
    method: str
    path: str
    body: Json | None
    headers: dict[str, str]


@dataclass(slots=True)
class _Fault:
    method: str
    path_prefix: str
    times: int
    status: int
    retry_after: float = 0.0
    after_commit: bool = False  # the request takes effect, then the connection is cut
    when: Callable[[Json], bool] | None = None  # only requests whose JSON body ({} if none) this accepts


@dataclass(slots=True)
class _Gateway:
    ws: web.WebSocketResponse
    request: web.Request
    ready: bool = False


@dataclass(slots=True)
class CdnFile:
    """An attachment that misbehaves: the message states ``declared_size`` (Discord's ``size``) while
    the CDN sends ``data``, chunked (no ``Content-Length``) or gzip-encoded (whatever the client
    accepts) if asked. ``served`` counts what went out."""

    filename: str
    content_type: str
    data: bytes
    declared_size: int | None = None  # None: the real size
    chunked: bool = False
    gzip: bool = False
    drip: float = 0.0  # > 0: one byte every so many seconds, over and over (a body that never finishes)
    served: int = 0


@dataclass(slots=True)
class Guild:
    id: str
    name: str
    channels: dict[str, str] = field(default_factory=dict)  # id -> name
    threads: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (parent id, name)
    # The bot's managed integration role: what a client's "@membot" often is (<@&role>).
    bot_role: str = field(default_factory=lambda: snowflake())
    bot_permissions: int = BOT_PERMISSIONS


class FakeDiscord:
    """The fake service (see the module doc). All ids are strings, as on the wire."""

    def __init__(
        self,
        *,
        token: str = "fake-discord-token",
        privileged_intents: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.token = token
        self.clock = clock  # (a test that shares it with the bot can let 15 minutes pass at once)
        self.privileged_intents = privileged_intents
        self.bot = FakeUser(snowflake(), "membot", bot=True)
        self.application_id = self.bot.id
        self.guilds: dict[str, Guild] = {}
        self.requests: list[RecordedRequest] = []
        self.messages: dict[str, Json] = {}  # every message by id (users' and the bot's)
        self.bot_messages: list[Json] = []  # what the bot posted, in order (edits update the dict)
        self.interaction_responses: list[tuple[str, Json]] = []  # (interaction id, callback body)
        self.commands: list[Json] = []
        self.command_puts = 0
        self.identifies: list[Json] = []
        self.resumes = 0
        self.typing: list[str] = []
        self._faults: list[_Fault] = []
        self.refused: dict[str, tuple[int, int, str]] = {}  # channel id -> (status, code, message)
        self.blocked_words: set[str] = set()  # a server's automatic moderation (see block_word)
        self._interactions: dict[str, Json] = {}  # token -> interaction
        self._interaction_born: dict[str, float] = {}  # token -> when, on ``clock``
        self._nonces: dict[tuple[str, str], str] = {}  # (channel id, nonce) -> message id
        self._files: dict[str, CdnFile] = {}  # attachment id -> what the CDN serves
        self._session_id: str | None = None
        self._intents = 0
        self._events: list[tuple[int, Json]] = []
        self._seq = 0
        self._gateway: _Gateway | None = None
        self._changed = asyncio.Condition()
        self._send_lock = asyncio.Lock()
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle --------------------------------------------------------------------------------

    async def __aenter__(self) -> FakeDiscord:
        app = web.Application()
        app.router.add_get("/gateway", self._gateway_handler)
        app.router.add_get("/attachments/{id}/{name}", self._attachment)
        app.router.add_route("*", "/api/v10/{tail:.*}", self._rest)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._gateway is not None:
            await self._gateway.ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base(self) -> str:
        return f"{self.base_url}/api/v10"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/gateway"

    # -- the world --------------------------------------------------------------------------------

    def add_guild(self, name: str = "guild") -> Guild:
        guild = Guild(snowflake(), name)
        self.guilds[guild.id] = guild
        return guild

    def add_channel(self, guild: Guild, name: str = "general") -> str:
        channel_id = snowflake()
        guild.channels[channel_id] = name
        return channel_id

    def add_thread(self, guild: Guild, parent_id: str, name: str = "thread") -> str:
        thread_id = snowflake()
        guild.threads[thread_id] = (parent_id, name)
        return thread_id

    def user(self, name: str) -> FakeUser:
        return FakeUser(snowflake(), name)

    def dm_channel(self) -> str:
        return snowflake()

    # -- faults -----------------------------------------------------------------------------------

    def rate_limit(self, method: str, path_prefix: str, *, times: int = 1, retry_after: float = 0.05) -> None:
        """The next ``times`` matching requests get 429 (with ``Via``, as Discord's edge sends)."""
        self._faults.append(_Fault(method, path_prefix, times, 429, retry_after))

    def fail(
        self,
        method: str,
        path_prefix: str,
        *,
        status: int = 503,
        times: int = 1,
        when: Callable[[Json], bool] | None = None,
    ) -> None:
        """The next ``times`` matching requests (with ``when``: whose JSON body it accepts) get ``status``."""
        self._faults.append(_Fault(method, path_prefix, times, status, when=when))

    def refuse_channel(self, channel_id: str, refusal: tuple[int, int, str] = CANNOT_DM) -> None:
        """From now on answer every request to ``channel_id`` with ``refusal`` (the user does not accept
        the bot's DMs, by default), as Discord does until someone acts; ``allow_channel`` undoes it."""
        self.refused[channel_id] = refusal

    def block_word(self, word: str) -> None:
        """From now on refuse any message holding ``word`` as a server's AutoMod keyword rule does:
        HTTP 400, code 200000 "Message was blocked by automatic moderation"."""
        self.blocked_words.add(word)

    def allow_channel(self, channel_id: str) -> None:
        self.refused.pop(channel_id, None)

    def clear_faults(self) -> None:
        """Discord is well again: the faults not yet used up are dropped."""
        self._faults.clear()

    def forget_nonces(self) -> None:
        """Minutes pass: Discord checks a nonce (``enforce_nonce``) against the past few minutes only, so a
        message sent again after that with the same nonce is posted again."""
        self._nonces.clear()

    def delete_message(self, message_id: str) -> None:
        """Someone deletes a message (a moderator, the bot's own): gone from the chat, from ``messages``
        and ``bot_messages``; an edit of it gets 404 "Unknown Message" (10008)."""
        self.messages.pop(message_id, None)
        self.bot_messages[:] = [m for m in self.bot_messages if m["id"] != message_id]

    def cut_after_commit(self, method: str, path_prefix: str, *, times: int = 1) -> None:
        """The next matching requests succeed on the server but the client never sees the answer."""
        self._faults.append(_Fault(method, path_prefix, times, 200, after_commit=True))

    async def drop(self) -> None:
        """Cut the gateway connection without a close frame, like a network failure."""
        gateway, self._gateway = self._gateway, None
        if gateway is not None and gateway.request.transport is not None:
            gateway.request.transport.abort()

    def invalidate_session(self) -> None:
        """The session can no longer be resumed (Discord answers RESUME with op 9): the client has to
        IDENTIFY again, and the events it missed are not replayed."""
        self._session_id = None

    async def request_reconnect(self) -> None:
        """Op 7 RECONNECT: the client should reconnect and RESUME."""
        gateway = self._gateway
        if gateway is not None:
            await gateway.ws.send_json({"op": 7, "d": None})

    # -- events to the bot ------------------------------------------------------------------------

    async def user_message(
        self,
        *,
        channel_id: str,
        author: FakeUser,
        content: str,
        guild: Guild | None = None,
        mentions: tuple[FakeUser, ...] = (),
        role_mentions: tuple[str, ...] = (),
        reply_to: Json | None = None,
        attachments: tuple[tuple[str, str, bytes] | CdnFile, ...] = (),  # (filename, content type, data)
        at: datetime | None = None,  # written then (its id says so too); default now
        stickers: tuple[str, ...] = (),  # sticker names
        forwarded: str | None = None,  # the content of a message this one forwards (Discord's "Forward")
        webhook_id: str | None = None,  # posted by that webhook (an integration, a followed channel)
    ) -> Json:
        """A user writes in a channel; MESSAGE_CREATE goes to the bot (now, or on its RESUME; a bot that
        is down and starts a new session gets it only from the channel's history)."""
        message: Json = {
            "id": snowflake(at),
            "channel_id": channel_id,
            "author": author.to_json(),
            "content": content,
            "timestamp": (at or datetime.now(UTC)).isoformat(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [u.to_json() for u in mentions],
            "mention_roles": list(role_mentions),
            "attachments": [
                self._attachment_json(a if isinstance(a, CdnFile) else CdnFile(*a)) for a in attachments
            ],
            "embeds": [],
            "pinned": False,
            "type": 19 if reply_to else 0,
            "flags": 0,
        }
        if guild is not None:
            message["guild_id"] = guild.id
            if webhook_id is None:  # a webhook is no member of the guild: Discord sends no "member"
                message["member"] = self._member()
        if webhook_id is not None:
            message["webhook_id"] = webhook_id
        if reply_to is not None:
            message["message_reference"] = {"message_id": reply_to["id"], "channel_id": channel_id}
            message["referenced_message"] = reply_to
        if stickers:
            message["sticker_items"] = [{"id": snowflake(), "name": n, "format_type": 1} for n in stickers]
        if forwarded is not None:  # a forward has no content of its own: the original is a snapshot
            original = {key: message[key] for key in ("type", "embeds", "attachments", "timestamp", "flags")}
            snapshot = {**original, "content": forwarded, "edited_timestamp": None}
            message["message_snapshots"] = [{"message": snapshot}]
            message["message_reference"] = {"type": 1, "message_id": snowflake(), "channel_id": channel_id}
        self.messages[message["id"]] = message
        await self._dispatch("MESSAGE_CREATE", message)
        return message

    async def slash_command(
        self,
        name: str,
        *,
        channel_id: str,
        user: FakeUser,
        guild: Guild | None = None,
        options: tuple[tuple[str, int, Any], ...] = (),  # (name, type, value)
    ) -> Json:
        """A user picks ``/name`` in the client; INTERACTION_CREATE (type 2) goes to the bot."""
        interaction: Json = {
            "id": snowflake(),
            "application_id": self.application_id,
            "type": 2,
            "token": "itok-" + secrets.token_hex(8),
            "version": 1,
            "channel_id": channel_id,
            "channel": {"id": channel_id, "type": 1 if guild is None else 0},
            "data": {
                "id": snowflake(),
                "name": name,
                "type": 1,
                "options": [{"name": n, "type": t, "value": v} for n, t, v in options],
            },
            "locale": "en-US",
            "attachment_size_limit": 10_485_760,
            "app_permissions": "0",
            "entitlements": [],
            "authorizing_integration_owners": {},
            "context": 1 if guild is None else 0,
        }
        if guild is not None:
            interaction["guild_id"] = guild.id
            interaction["member"] = {**self._member(), "user": user.to_json(), "permissions": "0"}
        else:
            interaction["user"] = user.to_json()
        self._interactions[interaction["token"]] = interaction
        self._interaction_born[interaction["token"]] = self.clock()
        await self._dispatch("INTERACTION_CREATE", interaction)
        return interaction

    # -- observation ------------------------------------------------------------------------------

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    async def wait_for_bot_messages(
        self, channel_id: str, count: int = 1, timeout: float = 10.0
    ) -> list[Json]:
        def posted() -> list[Json]:
            return [m for m in self.bot_messages if m["channel_id"] == channel_id]

        await self.wait_until(lambda: len(posted()) >= count, timeout)
        return posted()

    async def wait_for_followups(self, token: str, count: int = 1, timeout: float = 10.0) -> list[Json]:
        def found() -> list[Json]:
            return [m for m in self.bot_messages if m.get("interaction_token") == token]

        await self.wait_until(lambda: len(found()) >= count, timeout)
        return found()

    def bot_texts(self, channel_id: str) -> list[str]:
        return [str(m["content"]) for m in self.bot_messages if m["channel_id"] == channel_id]

    @property
    def connected(self) -> bool:
        return self._gateway is not None and self._gateway.ready

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- gateway ----------------------------------------------------------------------------------

    async def _dispatch(self, event: str, data: Json) -> None:
        async with self._send_lock:
            self._seq += 1
            self._events.append((self._seq, {"t": event, "d": data}))
            gateway = self._gateway
            if gateway is not None and gateway.ready:
                await self._send_event(gateway, self._seq, event, data)

    async def _send_event(self, gateway: _Gateway, seq: int, event: str, data: Json) -> None:
        if event == "MESSAGE_CREATE":
            data = self._as_seen_by_bot(data)
        # If the connection is gone, the client gets the event on RESUME.
        with contextlib.suppress(ConnectionError, RuntimeError):
            await gateway.ws.send_json({"op": 0, "s": seq, "t": event, "d": data})

    def _as_seen_by_bot(self, message: Json) -> Json:
        """Without MESSAGE_CONTENT a guild message keeps its content only if it mentions the bot."""
        if self._intents & MESSAGE_CONTENT or "guild_id" not in message:
            return message
        if message["author"]["id"] == self.bot.id:
            return message
        if any(u["id"] == self.bot.id for u in message.get("mentions", [])):
            return message
        return {**message, "content": "", "embeds": [], "attachments": [], "components": []}

    async def _gateway_handler(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        gateway = _Gateway(ws, request)
        self._gateway = gateway
        await ws.send_json({"op": 10, "d": {"heartbeat_interval": 41250}})
        async for msg in ws:
            if msg.type is not WSMsgType.TEXT:
                break
            payload = json.loads(msg.data)
            op = payload.get("op")
            if op == 1:
                await ws.send_json({"op": 11})
            elif op == 2:
                await self._identify(gateway, payload["d"])
            elif op == 6:
                await self._resume(gateway, payload["d"])
        if self._gateway is gateway:
            self._gateway = None
        await self._notify()
        return ws

    async def _identify(self, gateway: _Gateway, data: Json) -> None:
        if data.get("token") != self.token:
            await gateway.ws.close(code=4004, message=b"Authentication failed.")
            return
        intents = int(data.get("intents", 0))
        if intents & PRIVILEGED_INTENTS and not self.privileged_intents:
            await gateway.ws.close(code=4014, message=b"Disallowed intent(s).")
            return
        self.identifies.append(data)
        async with self._send_lock:
            self._intents = intents
            self._session_id = secrets.token_hex(16)
            self._events.clear()
            self._seq = 1
            ready = {
                "v": 10,
                "user": self.bot.to_json(),
                "guilds": [{"id": g, "unavailable": True} for g in self.guilds],
                "session_id": self._session_id,
                "resume_gateway_url": self.gateway_url,
                "application": {"id": self.application_id, "flags": 0},
                "private_channels": [],
            }
            await gateway.ws.send_json({"op": 0, "s": self._seq, "t": "READY", "d": ready})
            for guild in self.guilds.values():
                self._seq += 1
                data = self._guild_create(guild)
                await gateway.ws.send_json({"op": 0, "s": self._seq, "t": "GUILD_CREATE", "d": data})
            gateway.ready = True
        await self._notify()

    async def _resume(self, gateway: _Gateway, data: Json) -> None:
        if data.get("token") != self.token or data.get("session_id") != self._session_id:
            await gateway.ws.send_json({"op": 9, "d": False})
            return
        self.resumes += 1
        seen = int(data.get("seq") or 0)
        async with self._send_lock:
            for seq, event in self._events:
                if seq > seen:
                    await self._send_event(gateway, seq, event["t"], event["d"])
            self._seq += 1
            await gateway.ws.send_json({"op": 0, "s": self._seq, "t": "RESUMED", "d": {}})
            gateway.ready = True
        await self._notify()

    def _guild_create(self, guild: Guild) -> Json:
        channels = [
            {
                "id": cid,
                "type": 0,
                "name": name,
                "position": i,
                "guild_id": guild.id,
                "nsfw": False,
                "permission_overwrites": [],
                "parent_id": None,
                "topic": None,
                "rate_limit_per_user": 0,
                "last_message_id": self._last_message_id(cid),
            }
            for i, (cid, name) in enumerate(guild.channels.items())
        ]
        threads = [
            {
                "id": tid,
                "type": 11,
                "name": name,
                "parent_id": parent,
                "guild_id": guild.id,
                "owner_id": self.bot.id,
                "message_count": 0,
                "member_count": 1,
                "rate_limit_per_user": 0,
                "last_message_id": self._last_message_id(tid),
                "thread_metadata": {
                    "archived": False,
                    "auto_archive_duration": 1440,
                    "archive_timestamp": _now(),
                    "locked": False,
                },
            }
            for tid, (parent, name) in guild.threads.items()
        ]
        return {
            "id": guild.id,
            "name": guild.name,
            "icon": None,
            "owner_id": snowflake(),
            "features": [],
            "roles": [
                {
                    "id": guild.id,
                    "name": "@everyone",
                    "permissions": "0",
                    "position": 0,
                    "color": 0,
                    "hoist": False,
                    "managed": False,
                    "mentionable": False,
                    "flags": 0,
                },
                {
                    "id": guild.bot_role,
                    "name": self.bot.name,
                    "permissions": str(guild.bot_permissions),
                    "position": 1,
                    "color": 0,
                    "hoist": False,
                    "managed": True,
                    "mentionable": False,
                    "flags": 0,
                    "tags": {"bot_id": self.bot.id},
                },
            ],
            "emojis": [],
            "stickers": [],
            "channels": channels,
            "threads": threads,
            "members": [{**self._member(), "roles": [guild.bot_role], "user": self.bot.to_json()}],
            "member_count": 2,
            "presences": [],
            "voice_states": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
            "large": False,
            "unavailable": False,
            "joined_at": _now(),
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "premium_tier": 0,
            "preferred_locale": "en-US",
            "nsfw_level": 0,
        }

    def _last_message_id(self, channel_id: str) -> str | None:
        """The newest message's id, as Discord lists it with every channel (its time says how new)."""
        ids = [int(m["id"]) for m in self.messages.values() if m["channel_id"] == channel_id]
        return str(max(ids)) if ids else None

    @staticmethod
    def _member() -> Json:
        return {"roles": [], "joined_at": _now(), "deaf": False, "mute": False, "nick": None, "flags": 0}

    # -- REST -------------------------------------------------------------------------------------

    async def _rest(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["tail"]
        body: Json | None = None
        if request.can_read_body:
            body = await request.json()
        self.requests.append(RecordedRequest(request.method, path, body, dict(request.headers)))
        fault = self._take_fault(request.method, path, body)
        if fault is not None and not fault.after_commit:
            await self._notify()  # (a test may wait for the request that failed)
            if fault.status == 429:
                data = {
                    "message": "You are being rate limited.",
                    "retry_after": fault.retry_after,
                    "global": False,
                }
                return _json(
                    data, 429, {"Via": "1.1 google", "Retry-After": str(max(1, int(fault.retry_after)))}
                )
            return _json({"message": "Service Unavailable", "code": 0}, fault.status)
        public = path.startswith(("/interactions/", "/webhooks/"))
        if not public and request.headers.get("Authorization") != f"Bot {self.token}":
            return _json({"message": "401: Unauthorized", "code": 0}, 401)
        response = await self._route(request.method, path, body, request)
        if fault is not None and request.transport is not None:
            request.transport.abort()  # after_commit: done, but the answer never arrives
        await self._notify()
        return response

    def _take_fault(self, method: str, path: str, body: Json | None) -> _Fault | None:
        for fault in self._faults:
            if fault.method != method or not path.startswith(fault.path_prefix) or fault.times <= 0:
                continue
            if fault.when is None or fault.when(body if isinstance(body, dict) else {}):
                fault.times -= 1
                return fault
        return None

    async def _route(self, method: str, path: str, body: Json | None, request: web.Request) -> web.Response:
        parts = path.strip("/").split("/")
        if method == "GET" and path == "/users/@me":
            return _json(self.bot.to_json())
        if method == "GET" and path == "/oauth2/applications/@me":
            return _json(self._application())
        if parts[0] == "channels" and len(parts) >= 2:
            return self._channel_route(method, parts, body or {}, request.query)
        if parts[0] == "applications" and parts[2:] == ["commands"]:
            if method == "PUT":
                self.command_puts += 1
                self.commands = [
                    {**c, "id": snowflake(), "application_id": self.application_id, "version": snowflake()}
                    for c in (body or [])
                ]  # type: ignore[union-attr]
            return _json(self.commands)
        if parts[0] == "interactions" and len(parts) == 4 and parts[3] == "callback":
            return self._interaction_callback(parts[1], parts[2], body or {})
        if parts[0] == "webhooks" and len(parts) >= 3:
            return self._webhook(method, parts, body or {})
        return _json({"message": "404: Not Found", "code": 0}, 404)

    def _channel_route(
        self, method: str, parts: list[str], body: Json, query: Mapping[str, str]
    ) -> web.Response:
        channel_id = parts[1]
        if channel_id in self.refused:
            status, code, message = self.refused[channel_id]
            return _json({"message": message, "code": code}, status)
        if parts[2:] == ["typing"] and method == "POST":
            self.typing.append(channel_id)
            return web.Response(status=204)
        if not parts[2:] and method == "GET":
            return self._channel(channel_id)
        if parts[2:] == ["messages"] and method == "GET":
            # As Discord lists a page: up to ``limit`` (1 to 100) messages right after ``after``, right
            # before ``before``, or else the newest, always newest first; the content rules of the gateway
            # apply to the history too.
            limit = int(query.get("limit", 50))
            if not 1 <= limit <= 100:
                return _json({"code": 50035, "message": "Invalid Form Body"}, 400)
            found = sorted(
                (m for m in self.messages.values() if m["channel_id"] == channel_id),
                key=lambda m: int(m["id"]),
            )
            if "after" in query:
                listed = [m for m in found if int(m["id"]) > int(query["after"])][:limit]
            else:
                before = int(query.get("before", 1 << 64))
                listed = [m for m in found if int(m["id"]) < before][-limit:]
            return _json([self._as_seen_by_bot(m) for m in listed[::-1]])
        if parts[2:] == ["messages"] and method == "POST":
            error = self._invalid(body)
            if error is not None:
                return error
            nonce = body.get("nonce")
            if nonce and body.get("enforce_nonce") and (channel_id, nonce) in self._nonces:
                return _json(self.messages[self._nonces[(channel_id, nonce)]])  # deduplicated retry
            message = self._bot_message(channel_id, body)
            if nonce:
                self._nonces[(channel_id, nonce)] = message["id"]
            return _json(message)
        if len(parts) == 4 and parts[2] == "messages" and method == "PATCH":
            existing = self.messages.get(parts[3])
            if existing is None or existing["author"]["id"] != self.bot.id:
                return _json({"message": "Unknown Message", "code": 10008}, 404)
            error = self._invalid(body, edit=True)
            if error is not None:
                return error
            existing.update(content=body.get("content", existing["content"]), edited_timestamp=_now())
            return _json(existing)
        return _json({"message": "404: Not Found", "code": 0}, 404)

    def _channel(self, channel_id: str) -> web.Response:
        """GET /channels/{id}: a guild channel or thread, or a DM (known by its messages)."""
        for guild in self.guilds.values():
            created = self._guild_create(guild)
            for listed in created["channels"] + created["threads"]:
                if listed["id"] == channel_id:
                    return _json(listed)
        authors = [
            m["author"]
            for m in self.messages.values()
            if m["channel_id"] == channel_id and m["author"]["id"] != self.bot.id
        ]
        if not authors:
            return _json({"message": "Unknown Channel", "code": 10003}, 404)
        return _json({"id": channel_id, "type": 1, "recipients": authors[:1], "last_message_id": None})

    def _invalid(self, body: Json, *, edit: bool = False) -> web.Response | None:
        content = body.get("content")
        if content is not None and len(content) > CONTENT_LIMIT:
            return _json(
                {
                    "code": 50035,
                    "message": "Invalid Form Body",
                    "errors": {
                        "content": {
                            "_errors": [
                                {
                                    "code": "BASE_TYPE_MAX_LENGTH",
                                    "message": "Must be 2000 or fewer in length.",
                                }
                            ]
                        }
                    },
                },
                400,
            )
        if not edit and not content and not body.get("embeds") and not body.get("attachments"):
            return _json({"message": "Cannot send an empty message", "code": 50006}, 400)
        if content and any(word in content for word in self.blocked_words):
            return _json({"message": "Message was blocked by automatic moderation", "code": 200000}, 400)
        return None

    def _bot_message(self, channel_id: str, body: Json, **extra: Any) -> Json:
        reference = body.get("message_reference")
        message: Json = {
            "id": snowflake(),
            "channel_id": channel_id,
            "author": self.bot.to_json(),
            "content": body.get("content") or "",
            "timestamp": _now(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "pinned": False,
            "type": 19 if reference else 0,
            "flags": 0,
            "allowed_mentions": body.get("allowed_mentions"),  # recorded for the tests' asserts
            **extra,
        }
        if reference:
            message["message_reference"] = reference
        self.messages[message["id"]] = message
        self.bot_messages.append(message)
        return message

    def _interaction_callback(self, interaction_id: str, token: str, body: Json) -> web.Response:
        interaction = self._interactions.get(token)
        if interaction is None or interaction["id"] != interaction_id:
            return _json({"message": "Unknown interaction", "code": 10062}, 404)
        if interaction.get("responded"):
            return _json({"message": "Interaction has already been acknowledged.", "code": 40060}, 400)
        interaction["responded"] = True
        self.interaction_responses.append((interaction_id, body))
        if body.get("type") == 4:
            data = body.get("data") or {}
            error = self._invalid(data)
            if error is not None:
                return error
            self._bot_message(
                interaction["channel_id"], data, interaction_token=token, webhook_id=self.application_id
            )
        return _json(
            {
                "interaction": {
                    "id": interaction_id,
                    "type": 2,
                    "response_message_loading": body.get("type") == 5,
                }
            }
        )

    def _webhook(self, method: str, parts: list[str], body: Json) -> web.Response:
        token = parts[2]
        interaction = self._interactions.get(token)
        if parts[1] != self.application_id or interaction is None or not interaction.get("responded"):
            return _json({"message": "Unknown Webhook", "code": 10015}, 404)
        if self.clock() - self._interaction_born[token] > INTERACTION_TOKEN_TTL:
            return _json({"message": "Invalid Webhook Token", "code": 50027}, 401)
        channel_id = interaction["channel_id"]
        if method == "PATCH" and parts[3:] == ["messages", "@original"]:
            error = self._invalid(body, edit=True)
            if error is not None:
                return error
            original = interaction.get("original")
            if original is None:
                original = self._bot_message(
                    channel_id, body, interaction_token=token, webhook_id=self.application_id
                )
                interaction["original"] = original
            else:
                original.update(content=body.get("content", original["content"]), edited_timestamp=_now())
            return _json(original)
        if method == "POST" and len(parts) == 3:
            error = self._invalid(body)
            if error is not None:
                return error
            return _json(
                self._bot_message(channel_id, body, interaction_token=token, webhook_id=self.application_id)
            )
        return _json({"message": "404: Not Found", "code": 0}, 404)

    def _application(self) -> Json:
        return {
            "id": self.application_id,
            "name": "membot",
            "icon": None,
            "description": "",
            "bot_public": False,
            "bot_require_code_grant": False,
            "owner": FakeUser(snowflake(), "owner").to_json(),
            "verify_key": secrets.token_hex(32),
            "flags": 0,
            "team": None,
        }

    # -- attachments (the CDN) --------------------------------------------------------------------

    def _attachment_json(self, file: CdnFile) -> Json:
        attachment_id = snowflake()
        self._files[attachment_id] = file
        url = f"{self.base_url}/attachments/{attachment_id}/{file.filename}"
        return {
            "id": attachment_id,
            "filename": file.filename,
            "size": len(file.data) if file.declared_size is None else file.declared_size,
            "url": url,
            "proxy_url": url,
            "content_type": file.content_type,
        }

    async def _attachment(self, request: web.Request) -> web.StreamResponse:
        """The body in pieces, counted, until done or the client hung up."""
        file = self._files.get(request.match_info["id"])
        if file is None:
            return web.Response(status=404)

        def sent(n: int) -> None:
            file.served += n

        return await send_body(
            request, file.data, gzipped=file.gzip, chunked=file.chunked, drip=file.drip, sent=sent
        )
