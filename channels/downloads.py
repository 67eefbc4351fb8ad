"""Files users send, read no further than a cap: a stated size can be wrong, and a server can send more.

Discord's ``size`` and Telegram's ``file_size`` are what the platform says about a file, not what its
server sends: the field can be missing (Telegram), stale or wrong, and a misbehaving or hostile server
(a self-hosted Bot API, a proxy, a CDN that loops) can send without end. discord.py's
``Attachment.read()`` and PTB's ``File.download_as_bytearray()`` read whatever comes, so each channel
streams the body itself through :func:`bot.capped.read_at_most` and stops at its limit. A file over
the limit is not an error: the message goes on with :func:`too_large_note` in its text, so its words
still reach the model and the model can tell the user why the file went unread.

A file can also go unread for a reason the platform or the clock gives, and the user should hear
that too; the fetch raises one of these (a plain :class:`~bot.errors.ChannelError` means the file
could not be fetched at all):

    FileNotRead          the message goes on with ``note(name)`` in its text
    ├── FileTooLarge     the platform's own size limit (Telegram's getFile: "file is too big")
    └── DownloadTooSlow  not in by its deadline (also a builtin TimeoutError)

Bodies are asked for without compression (``Accept-Encoding: identity``) and one that comes
compressed anyway is refused: an HTTP library inflates each network chunk whole before the count here
sees it, so a small compressed chunk could still blow up in memory (see ``bot/tools/web_fetch.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

from bot.errors import ChannelError

# Ask for the body as stored; see the module doc.
PLAIN_BODY = {"Accept-Encoding": "identity"}


def encoded(headers: Mapping[str, str]) -> str | None:
    """The ``Content-Encoding`` a body came with, or None when it came as stored."""
    coding = headers.get("Content-Encoding", "").strip().lower()
    return coding if coding not in ("", "identity") else None


def stated_over(length: int | None, limit: int) -> bool:
    """Whether a stated size (a message's, ``getFile``'s, a ``Content-Length``) is over ``limit``;
    a missing one is not: the read itself stops at the limit then."""
    return length is not None and length > limit


def too_large_note(name: str, limit: int) -> str:
    """The words the model reads in place of a file over its limit (the user hears it from the model)."""
    return f"[{name} is larger than {limit} bytes, so it was not read.]"


def too_slow_note(name: str, seconds: float) -> str:
    """The words the model reads in place of a file whose download outlasted its deadline."""
    return f"[{name} took longer than {seconds:g} seconds to download, so it was not read.]"


class FileNotRead(ChannelError):
    """A file left unread for a reason the user should hear; see the module doc."""

    def note(self, name: str) -> str:
        """What the model reads in place of the file called ``name``."""
        raise NotImplementedError


class FileTooLarge(FileNotRead):
    """Larger than ``limit`` bytes by the platform's word, whatever the caller's own cap."""

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit

    def note(self, name: str) -> str:
        return too_large_note(name, self.limit)


class DownloadTooSlow(FileNotRead, TimeoutError):
    """Not fetched within ``seconds``. A byte cap bounds memory, not time: a server that drips a byte
    now and then never trips a read timeout, and would hold every message behind the file's."""

    def __init__(self, message: str, *, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds

    def note(self, name: str) -> str:
        return too_slow_note(name, self.seconds)
