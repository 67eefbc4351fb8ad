"""Files users send, read no further than a cap: a stated size can be wrong, and a server can send more.

Discord's ``size`` and Telegram's ``file_size`` are what the platform says about a file, not what its
server sends: the field can be missing (Telegram), stale or wrong, and a misbehaving or hostile server
(a self-hosted Bot API, a proxy, a CDN that loops) can send without end. discord.py's
``Attachment.read()`` and PTB's ``File.download_as_bytearray()`` read whatever comes, so each channel
streams the body itself through :func:`bot.capped.read_at_most` and stops at its limit. A file over
the limit is not an error: the message goes on with :func:`too_large_note` in its text, so its words
still reach the model and the model can tell the user why the file went unread.

Bodies are asked for without compression (``Accept-Encoding: identity``) and one that comes
compressed anyway is refused: an HTTP library inflates each network chunk whole before the count here
sees it, so a small compressed chunk could still blow up in memory (see ``bot/tools/web_fetch.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

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
