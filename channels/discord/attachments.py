"""What a Discord message carries besides text: attachments, made model-ready and read no further than a cap.

Images (for vision models) and small text files are downloaded; anything else is only named. The cap is
``discord.max_attachment_bytes``, and it holds whatever the message says: an attachment's ``size`` is
only what Discord states, and discord.py's ``Attachment.read()`` reads all the CDN sends. So the body is
streamed here with aiohttp, discord.py's own HTTP library, and the read stops at the cap; a file over it
becomes a note in the message text, so the user's words still reach the model and it can say why the
file went unread (:mod:`channels.downloads`). The operator gets a log line for each.

A message's downloads have a deadline too, all of them together (``discord.download_timeout``): the cap
bounds memory, not time, and a CDN that sends a byte now and then would hold the message back for as long
as it kept on. A file not in by then (or not started: the deadline has passed) is not read, and the
message goes on with its note (:class:`~channels.downloads.DownloadTooSlow`). The connection's own
limits (10 s to connect, 30 s without a byte) are failures like any other, not the deadline.

    reader = AttachmentReader(max_bytes=1_000_000, deadline=60.0, vision_supported=lambda: True)
    await reader.open()
    found = await reader.read(message)  # found.attachments, found.notes
    await reader.close()
"""

from __future__ import annotations

import asyncio
import mimetypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

import aiohttp
import discord
import structlog

from bot.capped import read_at_most
from bot.domain import Attachment
from bot.errors import ChannelError
from channels.downloads import PLAIN_BODY, DownloadTooSlow, encoded, stated_over, too_large_note

log = structlog.get_logger(__name__)

_CONNECTION_LIMITS = aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=30.0)
_TEXT_SUFFIXES = frozenset([
    ".txt", ".md", ".markdown", ".rst", ".log", ".csv", ".tsv", ".json", ".jsonl", ".yaml", ".yml", ".toml",
    ".ini", ".cfg", ".conf", ".xml", ".html", ".css", ".js", ".ts", ".py", ".rs", ".go", ".java", ".c", ".h",
    ".cpp", ".hpp", ".sh", ".sql", ".diff", ".patch",
])  # fmt: skip


@dataclass(frozen=True, slots=True)
class Found:
    """A message's attachments for the model, and notes to append to its text."""

    attachments: tuple[Attachment, ...] = ()
    notes: tuple[str, ...] = ()


class AttachmentReader:
    """Reads attachments from Discord's CDN up to ``max_bytes`` each; owns its HTTP session, opened by
    the channel's ``start`` and closed by its ``stop``. ``vision_supported`` is asked per image, so a
    model switch takes effect at once."""

    def __init__(self, *, max_bytes: int, deadline: float, vision_supported: Callable[[], bool]) -> None:
        self._max_bytes = max_bytes
        self._deadline = deadline
        self._vision_supported = vision_supported
        self._http: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        # No inflating: a compressed body is refused instead (see channels.downloads). No total limit of
        # aiohttp's own (5 minutes by default): the message's deadline is the one (see the module doc).
        self._http = aiohttp.ClientSession(
            headers=PLAIN_BODY, auto_decompress=False, timeout=_CONNECTION_LIMITS
        )

    async def close(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.close()

    async def read(self, message: discord.Message) -> Found:
        found: list[Attachment] = []
        notes: list[str] = []
        limit = self._max_bytes
        deadline = asyncio.get_running_loop().time() + self._deadline
        for item in message.attachments:
            mime = item.content_type or mimetypes.guess_type(item.filename)[0] or "application/octet-stream"
            mime = mime.split(";")[0].strip()
            named = Attachment("file", item.filename, mime, size=item.size)
            is_image = mime.startswith("image/")
            is_text = (
                mime.startswith("text/") or PurePosixPath(item.filename).suffix.lower() in _TEXT_SUFFIXES
            )
            if not (is_text or (is_image and self._vision_supported())):
                found.append(named)
                continue
            try:
                data = None if stated_over(item.size, limit) else await self._fetch(item.url, limit, deadline)
            except DownloadTooSlow as exc:
                log.warning("discord_attachment_too_slow", filename=item.filename, seconds=self._deadline)
                found.append(named)
                notes.append(exc.note(item.filename))
                continue
            except (ChannelError, aiohttp.ClientError, OSError) as exc:
                log.warning("discord_attachment_unreadable", filename=item.filename, error=str(exc))
                found.append(named)
                continue
            if data is None:
                log.info(
                    "discord_attachment_too_large", filename=item.filename, stated=item.size, limit=limit
                )
                found.append(named)
                notes.append(too_large_note(item.filename, limit))
            elif is_image:
                found.append(Attachment("image", item.filename, mime, data, len(data)))
            elif _is_utf8(data):
                found.append(Attachment("text", item.filename, mime, data, len(data)))
            else:
                found.append(named)
        return Found(tuple(found), tuple(notes))

    async def _fetch(self, url: str, limit: int, deadline: float) -> bytes | None:
        """The body at ``url``, or None once it passes ``limit`` bytes (leaving drops the connection).
        Raises :class:`DownloadTooSlow` once the message's ``deadline`` (the loop's clock) passed."""
        if self._http is None or self._http.closed:
            raise ChannelError("the Discord channel is not started")
        try:
            async with asyncio.timeout_at(deadline), self._http.get(url) as response:
                if response.status != 200:
                    raise ChannelError(f"Discord's CDN answered HTTP {response.status}")
                coding = encoded(response.headers)
                if coding is not None:
                    raise ChannelError(f"Discord's CDN sent the file {coding}-encoded")
                if stated_over(response.content_length, limit):
                    return None
                return await read_at_most(response.content.iter_any(), limit)
        except TimeoutError as exc:
            if isinstance(exc, aiohttp.ClientError):  # the connection's own limits: a failure
                raise
            seconds = self._deadline
            why = f"a Discord attachment took longer than {seconds:g} s (discord.download_timeout)"
            raise DownloadTooSlow(why, seconds=seconds) from None


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
