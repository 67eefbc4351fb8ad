"""Fetching a file a user sent on Telegram, never more of it than a cap (see :mod:`channels.downloads`).

PTB's ``File.download_as_bytearray`` reads all its server sends, and ``file_size`` is optional in the
Bot API, so a size check before it bounds nothing. Here PTB still asks ``getFile`` (a stated size
over the cap ends it there), then the body is streamed with httpx, the HTTP library PTB itself uses,
and the read stops at the cap. Failures map to PTB's own errors the way its ``HTTPXRequest`` maps
them, so the outbox retries a timeout, a dropped connection or a 5xx of the download like any other
Bot API request. A self-hosted Bot API server in ``--local`` mode names a path on this machine
instead of a URL; that file is read up to the cap too.

A whole fetch (``getFile``, the body, the retries of both) has a deadline, ``telegram.download_timeout``:
the read timeout only bounds the wait for the next bytes, and a chat's messages are taken in one at a
time, so a file server that drips bytes would hold that chat's later messages back for good (other
chats go on meanwhile: :mod:`channels.telegram.handover`). Past the deadline, and when
``getFile`` refuses a file over the Bot API's own limit (20 MB: "file is too big"), the fetch raises a
:class:`~channels.downloads.FileNotRead` and the message goes on with its note.

The file URL carries the bot token: it is never logged, and no error here quotes it.

    files = TelegramFiles(bot, outbox, deadline=60.0)
    data = await files.fetch(file_id, limit=1_000_000)  # None: larger than the limit
    await files.close()
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from telegram import Bot
from telegram.error import BadRequest, NetworkError, TelegramError, TimedOut

from bot.capped import read_at_most
from bot.errors import ChannelError
from channels.downloads import PLAIN_BODY, DownloadTooSlow, FileTooLarge, encoded, stated_over
from channels.telegram.outbound import TelegramOutbox

# As PTB's HTTPXRequest: 5 s to connect; a read may wait longer, as a big file comes in slowly.
_TIMEOUT = httpx.Timeout(20.0, connect=5.0)
# The largest file the Bot API serves to bots (a self-hosted server in --local mode serves more).
BOT_API_MAX_BYTES = 20_000_000


class TelegramFiles:
    """Files by ``file_id``, read no further than the caller's limit and for no longer than
    ``deadline`` seconds; owns its HTTP client."""

    def __init__(self, bot: Bot, outbox: TelegramOutbox, *, deadline: float) -> None:
        self._bot = bot
        self._outbox = outbox
        self._deadline = deadline
        self._http = httpx.AsyncClient(timeout=_TIMEOUT, headers=PLAIN_BODY)

    async def close(self) -> None:
        await self._http.aclose()

    async def fetch(self, file_id: str, *, limit: int) -> bytes | None:
        """The file's bytes, or None when it is larger than ``limit`` (as stated, or found while
        reading). Raises :class:`~channels.downloads.FileNotRead` when the Bot API refuses it for its
        size or the deadline passes, :class:`ChannelError` when it cannot be fetched."""

        async def once() -> bytes | None:
            file = await self._bot.get_file(file_id)
            if stated_over(file.file_size, limit):
                return None
            if not file.file_path:
                raise ChannelError("Telegram named no file_path for the file")
            if not file.file_path.startswith(("http://", "https://")):
                return await asyncio.to_thread(_read_local, Path(file.file_path), limit)
            return await self._read(file.file_path, limit)

        try:
            async with asyncio.timeout(self._deadline):
                return await self._outbox.call(once, what="getFile")
        except TimeoutError:
            seconds = self._deadline
            why = f"a Telegram file took longer than {seconds:g} s to download (telegram.download_timeout)"
            raise DownloadTooSlow(why, seconds=seconds) from None
        except BadRequest as exc:
            if _is_too_big(exc):
                limit = min(limit, BOT_API_MAX_BYTES)
                raise FileTooLarge(f"Telegram refused the file: {exc}", limit=limit) from exc
            raise ChannelError(f"could not download a Telegram file: {exc}") from exc
        except TelegramError as exc:
            raise ChannelError(f"could not download a Telegram file: {exc}") from exc

    async def _read(self, url: str, limit: int) -> bytes | None:
        try:
            async with self._http.stream("GET", url) as response:
                status = response.status_code
                if status >= 500:
                    raise NetworkError(f"Telegram's file server answered HTTP {status}")
                if status != 200:
                    raise TelegramError(f"Telegram's file server answered HTTP {status}")
                coding = encoded(response.headers)
                if coding is not None:
                    raise TelegramError(f"Telegram's file server sent the file {coding}-encoded")
                length = response.headers.get("Content-Length")
                if stated_over(int(length) if length and length.isdigit() else None, limit):
                    return None
                return await read_at_most(response.aiter_raw(), limit)
        except httpx.TimeoutException as exc:
            raise TimedOut(f"the file download timed out ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:  # its message can hold the URL, and with it the token
            raise NetworkError(f"the file download failed ({type(exc).__name__})") from exc


def _is_too_big(exc: BadRequest) -> bool:
    """getFile's answer for a file over the Bot API's limit ("Bad Request: file is too big"); PTB
    strips the "Bad Request: " part."""
    return "file is too big" in str(exc).lower()


def _read_local(path: Path, limit: int) -> bytes | None:
    """A file a local Bot API server keeps on this machine, up to ``limit`` bytes (None past it)."""
    try:
        with path.open("rb") as file:
            data = file.read(limit + 1)
    except OSError as exc:
        raise ChannelError(f"could not read a Telegram file from disk: {exc.strerror}") from exc
    return None if len(data) > limit else data
