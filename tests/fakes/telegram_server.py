"""A fake Telegram Bot API on 127.0.0.1 that the real python-telegram-bot talks to.

It speaks the wire protocol PTB uses (every method a POST to ``/bot<token>/<method>``, form-encoded,
multipart or JSON bodies, ``{"ok": ..., "result": ...}`` envelopes), holds ``getUpdates`` open like the
real long poll, and enforces the rules a wrong formatter or splitter would break: 4096 UTF-16 units
counted after entity parsing, and only well-formed HTML with Telegram's tags. Errors can be injected
per method (429 with ``retry_after``, 400 parse errors, 5xx), a method can answer late after it took
effect (``slow``: a client's read timeout cannot tell that from a lost request), and a chat can refuse
the bot for good (:meth:`FakeTelegramServer.refuse_chat`, with the Bot API's own answers: ``BLOCKED``,
``KICKED``, ``CHAT_NOT_FOUND``). Files are served under ``/file/bot<token>/<file_path>``; a test can make ``getFile``
state a wrong ``file_size`` or none (the field is optional in the Bot API), and serve the body chunked,
without ``Content-Length``, a byte at a time without end, or only once the test lets it go, as a
misbehaving or slow server would (:meth:`FakeTelegramServer.add_file`). ``getFile`` refuses a file
over the Bot API's 20 MB as it does.

    async with FakeTelegramServer() as tg:
        app = ApplicationBuilder().token(tg.token).base_url(tg.base_url).base_file_url(tg.base_file_url)
        tg.push_message(chat_id=777, text="hi")
        [reply] = await tg.wait_for_messages(1)
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import itertools
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import EllipsisType
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes.file_body import send_body

TOKEN = "123456789:AAFakeTokenForTestsOnly_abcdefghijklmno"
TEXT_LIMIT = 4096
GET_FILE_LIMIT = 20 * 1024 * 1024  # the largest file the Bot API lets a bot download
ALLOWED_TAGS = {
    "b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span", "tg-spoiler", "a", "code",
    "pre", "blockquote", "tg-emoji",
}  # fmt: skip
_TEXT_FIELDS = {"text", "caption", "parse_mode", "url", "secret_token", "action", "file_id", "description"}
_TAG_OR_ENTITY = re.compile(
    r"<(/?)([A-Za-z][A-Za-z0-9-]*)((?:\s+[^<>]*)?)>|&(#\d+|#x[0-9A-Fa-f]+|[A-Za-z]+);"
)


class TelegramAPIError(Exception):
    def __init__(self, status: int, description: str, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.retry_after = retry_after


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def parse_html(text: str) -> str:
    """Validate Telegram HTML like the Bot API does and return the visible text; raise on errors."""
    visible: list[str] = []
    stack: list[str] = []
    pos = 0
    for match in _TAG_OR_ENTITY.finditer(text):
        plain = text[pos : match.start()]
        _check_plain(plain, pos)
        visible.append(plain)
        pos = match.end()
        closing, name, _attrs, entity = match.group(1), match.group(2), match.group(3), match.group(4)
        if entity is not None:
            if not entity.startswith("#") and entity not in ("lt", "gt", "amp", "quot"):
                raise _parse_error(f'Unsupported HTML entity "&{entity};" at byte offset {match.start()}')
            visible.append(html.unescape(match.group(0)))
            continue
        name = name.lower()
        if name not in ALLOWED_TAGS:
            raise _parse_error(f'Unsupported start tag "{name}" at byte offset {match.start()}')
        if not closing and name == "span" and "tg-spoiler" not in (match.group(3) or ""):
            raise _parse_error(f'Unsupported start tag "span" at byte offset {match.start()}')
        if closing:
            if not stack or stack[-1] != name:
                raise _parse_error(f"Unexpected end tag at byte offset {match.start()}")
            stack.pop()
        else:
            if ("pre" in stack and name != "code") or "code" in stack:
                raise _parse_error(f"Can't nest entities inside a code block at byte offset {match.start()}")
            stack.append(name)
    _check_plain(text[pos:], pos)
    visible.append(text[pos:])
    if stack:
        raise _parse_error(f'Can\'t find end tag corresponding to start tag "{stack[-1]}"')
    return "".join(visible)


def _check_plain(plain: str, offset: int) -> None:
    for char in ("<", ">", "&"):
        index = plain.find(char)
        if index >= 0:
            raise _parse_error(f"Unexpected character {char!r} at byte offset {offset + index}")


# What the Bot API answers every request aimed at a chat the bot can no longer reach.
BLOCKED = (403, "Forbidden: bot was blocked by the user")
KICKED = (403, "Forbidden: bot was kicked from the group chat")
CHAT_NOT_FOUND = (400, "Bad Request: chat not found")


def _parse_error(detail: str) -> TelegramAPIError:
    return TelegramAPIError(400, f"Bad Request: can't parse entities: {detail}")


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass
class Sent:
    """A message as Telegram would store it (after entity parsing)."""

    message_id: int
    chat_id: int
    text: str  # visible text
    raw: str  # what the bot sent
    parse_mode: str | None
    thread_id: int | None = None
    reply_to: int | None = None
    edits: int = 0


@dataclass
class StoredFile:
    """A file as the fake's file server keeps it, and what ``getFile`` says about it."""

    path: str
    content: bytes
    file_size: int | None  # what getFile states (None: left out)
    chunked: bool = False  # served without Content-Length
    gzip: bool = False  # served gzip-encoded, even to a client that asked for no encoding
    failures: int = 0  # the next downloads answered with 502
    drip: float = 0.0  # > 0: one byte every so many seconds, never ending (a body that never finishes)
    held: asyncio.Event | None = None  # the body waits until this is set (a slow server, no clock)
    served: int = 0  # bytes written to the bot so far, over all downloads
    downloads: int = 0  # requests for the body, answered or not


@dataclass
class Failure:
    method: str
    status: int
    description: str
    retry_after: int | None = None
    times: int = 1
    when: Callable[[dict[str, Any]], bool] | None = None


class FakeTelegramServer:
    """See the module doc. Attributes record what the bot did; methods script what users do."""

    def __init__(self, *, token: str = TOKEN, username: str = "membot_test_bot") -> None:
        self.token = token
        self.bot_user = {"id": 4242, "is_bot": True, "first_name": "membot", "username": username}
        self.calls: list[Call] = []
        self.messages: dict[int, Sent] = {}  # message_id -> the bot's messages
        self.commands: list[dict[str, str]] = []
        self.webhook: dict[str, Any] | None = None
        self.failures: list[Failure] = []
        self.files: dict[str, StoredFile] = {}  # by file_id
        self.refused: dict[int, tuple[int, str]] = {}  # chat id -> (status, description)
        self.slow: dict[str, float] = {}  # method -> seconds its answer comes late (it took effect at once)
        self._updates: list[dict[str, Any]] = []
        self._update_ids = itertools.count(1)
        self._message_ids = itertools.count(1000)
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    # -- lifecycle ----------------------------------------------------------------------------------

    async def __aenter__(self) -> FakeTelegramServer:
        app = web.Application(client_max_size=60 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/bot"

    @property
    def base_file_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/file/bot"

    # -- scripting users ----------------------------------------------------------------------------

    def push_update(self, update: dict[str, Any]) -> dict[str, Any]:
        update = {"update_id": next(self._update_ids), **update}
        self._updates.append(update)
        task = asyncio.get_running_loop().create_task(self._notify())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return update

    def user_message(
        self,
        text: str | None = "hi",
        *,
        chat_id: int = 777,
        user_id: int = 42,
        first_name: str = "Alice",
        chat_type: str = "private",
        is_bot: bool = False,
        entities: list[dict[str, Any]] | None = None,
        reply_to_bot: bool = False,
        thread_id: int | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """A message dict as Telegram sends it; ``@username`` mentions get their entities."""
        chat: dict[str, Any] = {"id": chat_id, "type": chat_type}
        if chat_type != "private":
            chat["title"] = "Test group"
            if thread_id is not None:
                chat["is_forum"] = True
        message: dict[str, Any] = {
            "message_id": next(self._message_ids),
            "date": int(time.time()),
            "chat": chat,
            "from": {"id": user_id, "is_bot": is_bot, "first_name": first_name},
        }
        if text is not None:
            message["text"] = text
            found = entities if entities is not None else _entities(text)
            if found:
                message["entities"] = found
        if reply_to_bot:
            message["reply_to_message"] = {
                "message_id": 1,
                "date": int(time.time()),
                "chat": chat,
                "from": self.bot_user,
                "text": "earlier answer",
            }
        if thread_id is not None:
            message["message_thread_id"] = thread_id
            message["is_topic_message"] = True
        message.update(extra)
        return message

    def push_message(self, text: str | None = "hi", **kwargs: Any) -> dict[str, Any]:
        return self.push_update({"message": self.user_message(text, **kwargs)})

    def add_file(
        self,
        content: bytes,
        path: str,
        *,
        file_size: int | EllipsisType | None = ...,
        chunked: bool = False,
        gzip: bool = False,
        failures: int = 0,
        drip: float = 0.0,
        held: asyncio.Event | None = None,
    ) -> str:
        """Store a file to be fetched with ``getFile``; returns its ``file_id``.

        ``file_size`` is what ``getFile`` states: the real size by default, another number to lie, None
        to leave the optional field out. The file server misbehaves if asked: ``chunked`` sends no
        ``Content-Length``, ``gzip`` compresses whatever the client accepts, and the first ``failures``
        downloads get a 502; ``drip`` sends the content a byte every ``drip`` seconds, over and over, until
        the client hangs up (each byte comes well within any read timeout, the body never ends); ``held``
        sends the headers and keeps the body back until the test sets the event (``downloads`` counts the
        requests, so a test can wait until the bot is waiting).
        """
        file_id = f"file{len(self.files) + 1}"
        stated = len(content) if isinstance(file_size, EllipsisType) else file_size
        self.files[file_id] = StoredFile(path, content, stated, chunked, gzip, failures, drip, held)
        return file_id

    def fail(
        self,
        method: str,
        status: int,
        description: str,
        *,
        retry_after: int | None = None,
        times: int = 1,
        when: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        """Answer the next ``times`` matching calls of ``method`` with an error."""
        self.failures.append(Failure(method, status, description, retry_after, times, when))

    def refuse_chat(self, chat_id: int, refusal: tuple[int, str] = BLOCKED) -> None:
        """From now on answer every request aimed at ``chat_id`` with ``refusal`` (the user blocked the
        bot, by default), as Telegram does until someone acts; ``allow_chat`` undoes it."""
        self.refused[chat_id] = refusal

    def allow_chat(self, chat_id: int) -> None:
        self.refused.pop(chat_id, None)

    async def post_webhook(self, update: dict[str, Any], *, secret: str | None) -> int:
        """Deliver an update to the registered webhook as Telegram does; returns the HTTP status.

        An update that already carries its ``update_id`` keeps it: that is how Telegram delivers an
        update again after an answer other than 2xx, or one that never arrived."""
        assert self.webhook is not None and self._session is not None, "no webhook registered"
        update = {"update_id": next(self._update_ids), **update}
        headers = {"Content-Type": "application/json"}
        if secret is not None:
            headers["X-Telegram-Bot-Api-Secret-Token"] = secret
        async with self._session.post(self.webhook["url"], data=json.dumps(update), headers=headers) as r:
            return r.status

    # -- observing the bot --------------------------------------------------------------------------

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def sent_to(self, chat_id: int) -> list[Sent]:
        return [m for m in self.messages.values() if m.chat_id == chat_id]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    async def wait_for_messages(self, count: int, chat_id: int = 777, timeout: float = 10.0) -> list[Sent]:
        await self.wait_for(lambda: len(self.sent_to(chat_id)) >= count, timeout)
        return self.sent_to(chat_id)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- the API ------------------------------------------------------------------------------------

    async def _api(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return _error(TelegramAPIError(401, "Unauthorized"))
        method = request.match_info["method"]
        params, files = await _read_params(request)
        self.calls.append(Call(method, params, files))
        await self._notify()
        try:
            self._maybe_fail(method, params)
            handler = getattr(self, f"_m_{method}", None)
            if handler is None:
                raise TelegramAPIError(404, "Not Found: method not found")
            result = await handler(params)
        except TelegramAPIError as exc:
            return _error(exc)
        await self._notify()
        if method in self.slow:  # a slow Bot API: done, but the answer is late
            await asyncio.sleep(self.slow[method])
        return web.json_response({"ok": True, "result": result})

    def _maybe_fail(self, method: str, params: dict[str, Any]) -> None:
        for failure in self.failures:
            if (
                failure.method == method
                and failure.times > 0
                and (failure.when is None or failure.when(params))
            ):
                failure.times -= 1
                raise TelegramAPIError(failure.status, failure.description, failure.retry_after)
        chat = params.get("chat_id")
        refusal = self.refused.get(chat) if isinstance(chat, int) else None
        if refusal is not None:
            raise TelegramAPIError(*refusal)

    async def _m_getMe(self, params: dict[str, Any]) -> Any:
        return {**self.bot_user, "can_join_groups": True, "can_read_all_group_messages": False}

    async def _m_deleteWebhook(self, params: dict[str, Any]) -> Any:
        self.webhook = None
        if params.get("drop_pending_updates"):
            self._updates.clear()
        return True

    async def _m_setWebhook(self, params: dict[str, Any]) -> Any:
        secret = params.get("secret_token")
        if secret is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", str(secret)):
            raise TelegramAPIError(400, "Bad Request: secret token contains unallowed characters")
        self.webhook = {"url": params["url"], "secret_token": secret}
        return True

    async def _m_getWebhookInfo(self, params: dict[str, Any]) -> Any:
        url = self.webhook["url"] if self.webhook else ""
        return {"url": url, "has_custom_certificate": False, "pending_update_count": 0}

    async def _m_getUpdates(self, params: dict[str, Any]) -> Any:
        if self.webhook is not None:
            raise TelegramAPIError(409, "Conflict: can't use getUpdates method while webhook is active")
        offset = int(params.get("offset") or 0)
        if offset:
            self._updates = [u for u in self._updates if u["update_id"] >= offset]
        limit = int(params.get("limit") or 100)
        timeout = float(params.get("timeout") or 0)
        if not self._updates and timeout > 0:
            async with self._changed:
                try:
                    async with asyncio.timeout(timeout):
                        await self._changed.wait_for(lambda: bool(self._updates))
                except TimeoutError:
                    pass
        return self._updates[:limit]

    async def _m_sendChatAction(self, params: dict[str, Any]) -> Any:
        return True

    async def _m_setMyCommands(self, params: dict[str, Any]) -> Any:
        commands = params["commands"]
        for command in commands:
            if not re.fullmatch(r"[a-z0-9_]{1,32}", command["command"]):
                raise TelegramAPIError(400, "Bad Request: BOT_COMMAND_INVALID")
            if not 1 <= len(command["description"]) <= 256:
                raise TelegramAPIError(400, "Bad Request: command description is invalid")
        self.commands = commands
        return True

    async def _m_getMyCommands(self, params: dict[str, Any]) -> Any:
        return self.commands

    async def _m_sendMessage(self, params: dict[str, Any]) -> Any:
        chat_id = int(params["chat_id"])
        raw = str(params.get("text", ""))
        mode = params.get("parse_mode")
        visible = _visible(raw, mode)
        sent = Sent(
            message_id=next(self._message_ids),
            chat_id=chat_id,
            text=visible,
            raw=raw,
            parse_mode=mode,
            thread_id=params.get("message_thread_id"),
            reply_to=(params.get("reply_parameters") or {}).get("message_id"),
        )
        self.messages[sent.message_id] = sent
        return self._message_json(sent)

    async def _m_editMessageText(self, params: dict[str, Any]) -> Any:
        message_id = int(params["message_id"])
        sent = self.messages.get(message_id)
        if sent is None or sent.chat_id != int(params["chat_id"]):
            raise TelegramAPIError(400, "Bad Request: message to edit not found")
        raw = str(params.get("text", ""))
        mode = params.get("parse_mode")
        visible = _visible(raw, mode)
        if visible == sent.text and mode == sent.parse_mode:
            raise TelegramAPIError(
                400,
                "Bad Request: message is not modified: specified new message content and reply markup "
                "are exactly the same as a current content and reply markup of the message",
            )
        sent.text, sent.raw, sent.parse_mode = visible, raw, mode
        sent.edits += 1
        return self._message_json(sent)

    async def _m_getFile(self, params: dict[str, Any]) -> Any:
        file_id = str(params["file_id"])
        if file_id not in self.files:
            raise TelegramAPIError(400, "Bad Request: invalid file_id")
        stored = self.files[file_id]
        if len(stored.content) > GET_FILE_LIMIT:
            raise TelegramAPIError(400, "Bad Request: file is too big")
        found: dict[str, Any] = {
            "file_id": file_id,
            "file_unique_id": f"u{file_id}",
            "file_path": stored.path,
        }
        if stored.file_size is not None:
            found["file_size"] = stored.file_size
        return found

    async def _download(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return web.Response(status=401)
        for stored in self.files.values():
            if stored.path == request.match_info["path"]:
                stored.downloads += 1
                await self._notify()
                return await _serve(request, stored)
        return web.Response(status=404)

    def _message_json(self, sent: Sent) -> dict[str, Any]:
        message: dict[str, Any] = {
            "message_id": sent.message_id,
            "date": int(time.time()),
            "chat": {"id": sent.chat_id, "type": "private" if sent.chat_id > 0 else "supergroup"},
            "from": self.bot_user,
            "text": sent.text,
        }
        if sent.thread_id is not None:
            message["message_thread_id"] = sent.thread_id
        return message


def _visible(raw: str, mode: Any) -> str:
    if mode is None:
        visible = raw
    elif str(mode).upper() == "HTML":
        visible = parse_html(raw)
    else:
        raise TelegramAPIError(400, f"Bad Request: unsupported parse_mode {mode!r} in this fake")
    if not visible.strip():
        raise TelegramAPIError(400, "Bad Request: message text is empty")
    if utf16_len(visible) > TEXT_LIMIT:
        raise TelegramAPIError(400, "Bad Request: message is too long")
    return visible


def _entities(text: str) -> list[dict[str, Any]]:
    """Entities Telegram would attach: @mentions and /commands, with UTF-16 offsets."""
    found: list[dict[str, Any]] = []
    for kind, pattern in (
        ("mention", r"@[A-Za-z0-9_]{5,32}"),
        ("bot_command", r"(?<!\S)/[A-Za-z0-9_]+(?:@[A-Za-z0-9_]+)?"),
    ):
        for match in re.finditer(pattern, text):
            found.append(
                {
                    "type": kind,
                    "offset": utf16_len(text[: match.start()]),
                    "length": utf16_len(match.group(0)),
                }
            )
    return sorted(found, key=lambda e: e["offset"])


async def _read_params(request: web.Request) -> tuple[dict[str, Any], dict[str, bytes]]:
    params: dict[str, Any] = {}
    files: dict[str, bytes] = {}
    raw: dict[str, Any] = dict(request.query)
    if request.content_type == "application/json":
        raw.update(await request.json())
    elif request.can_read_body:
        form = await request.post()
        for key, value in form.items():
            if isinstance(value, web.FileField):
                files[key] = value.file.read()
            else:
                raw[key] = value
    for key, value in raw.items():
        if isinstance(value, str) and key not in _TEXT_FIELDS:
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        params[key] = value
    return params, files


def _error(exc: TelegramAPIError) -> web.Response:
    body: dict[str, Any] = {"ok": False, "error_code": exc.status, "description": exc.description}
    if exc.retry_after is not None:
        body["parameters"] = {"retry_after": exc.retry_after}
    return web.json_response(body, status=exc.status)


async def _serve(request: web.Request, stored: StoredFile) -> web.StreamResponse:
    """Write ``stored`` in pieces, counting what went out, until done or the client hung up."""
    if stored.failures:
        stored.failures -= 1
        return web.Response(status=502, text="Bad Gateway")

    def sent(n: int) -> None:
        stored.served += n

    return await send_body(
        request,
        stored.content,
        gzipped=stored.gzip,
        chunked=stored.chunked,
        drip=stored.drip,
        held=stored.held,
        sent=sent,
    )
