"""What a Telegram message carries besides text: photos, documents and the rest, made model-ready.

Photos go to the model as images when the active model can see them; otherwise the text gets a note,
so the model can tell the user instead of guessing. Text documents up to a size limit are read as text.
Everything else (voice, video, stickers, large or binary files) is acknowledged in the text, never
silently dropped; voice, audio, video and the rest are never downloaded at all.

Photos and documents are read no further than their limit, whatever size Telegram states (the field
is optional, and a server can send more than it says): ``download`` stops there and returns None, and
the file becomes a note (see :mod:`channels.downloads`). So does a file Telegram refuses for its size
or one not in by the download deadline (``download`` raises :class:`~channels.downloads.FileNotRead`).
"""

from __future__ import annotations

import mimetypes
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import structlog
from telegram import Message

from bot.domain import Attachment
from bot.errors import ChannelError
from channels.downloads import FileNotRead, stated_over, too_large_note

log = structlog.get_logger(__name__)

MAX_IMAGE_BYTES = 10_000_000
_TEXT_SUFFIXES = {
    ".txt", ".md", ".markdown", ".rst", ".csv", ".tsv", ".json", ".jsonl", ".yaml", ".yml", ".toml",
    ".ini", ".cfg", ".conf", ".log", ".py", ".js", ".ts", ".tsx", ".jsx", ".java", ".kt", ".go", ".rs",
    ".c", ".h", ".cpp", ".hpp", ".cs", ".rb", ".php", ".sh", ".bash", ".zsh", ".sql", ".html", ".htm",
    ".css", ".xml", ".svg", ".tex", ".env", ".diff", ".patch",
}  # fmt: skip
_TEXT_MIMES = {
    "application/json",
    "application/xml",
    "application/x-yaml",
    "application/toml",
    "application/sql",
}

# download(file_id, limit): the file's bytes, or None when it is larger than limit bytes; raises
# FileNotRead for a file left unread for another reason the user should hear, ChannelError otherwise.
Download = Callable[[str, int], Awaitable[bytes | None]]


@dataclass(slots=True)
class Extracted:
    """Attachments to hand on, and notes to append to the message text."""

    attachments: list[Attachment] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def is_text_document(mime_type: str, file_name: str) -> bool:
    return (
        mime_type.startswith("text/")
        or mime_type in _TEXT_MIMES
        or PurePosixPath(file_name.lower()).suffix in _TEXT_SUFFIXES
    )


async def extract_media(
    message: Message,
    *,
    download: Download,
    vision: bool,
    max_document_bytes: int,
) -> Extracted:
    """Download what the model can use from ``message``; describe the rest in notes.

    ``download(file_id, limit)`` returns None for a file over ``limit``, raises
    :class:`~channels.downloads.FileNotRead` for one left unread for another reason the user should hear
    and :class:`ChannelError` when a file cannot be fetched; each becomes a note, so the user's words
    still reach the model.
    """
    out = Extracted()
    try:
        await _extract(out, message, download=download, vision=vision, max_document_bytes=max_document_bytes)
    except ChannelError as exc:
        log.warning("telegram_download_failed", chat_id=message.chat_id, error=str(exc))
        out.notes.append("[The user sent a file that could not be downloaded from Telegram.]")
    return out


async def _extract(
    out: Extracted, message: Message, *, download: Download, vision: bool, max_document_bytes: int
) -> None:
    if message.photo:
        photo = message.photo[-1]  # the largest size Telegram generated
        if not vision:
            out.notes.append("[The user sent a photo, but the current model cannot see images.]")
        else:
            await _photo(out, photo.file_id, photo.file_size, download=download, chat_id=message.chat_id)
    document = message.document
    if document is not None:
        await _document(out, document.file_id, document.file_name, document.mime_type, document.file_size,
                        download=download, vision=vision, max_bytes=max_document_bytes,
                        chat_id=message.chat_id)  # fmt: skip
    for label, present in (
        ("a voice message (audio cannot be listened to here)", message.voice),
        ("an audio file (audio cannot be listened to here)", message.audio),
        ("a video (videos cannot be watched here)", message.video or message.video_note),
        ("an animation", message.animation),
        ("a location", message.location),
        ("a contact", message.contact),
        ("a poll", message.poll),
        ("a story", message.story),
        ("a game", message.game),
    ):
        if present:
            out.notes.append(f"[The user sent {label}.]")
    if message.dice is not None:  # a dice, darts or slot-machine emoji, and what it rolled
        out.notes.append(f"[The user rolled {message.dice.emoji}: {message.dice.value}]")
    if message.sticker is not None:
        out.notes.append(f"[sticker {message.sticker.emoji or ''}]".replace(" ]", "]"))


async def _photo(
    out: Extracted, file_id: str, file_size: int | None, *, download: Download, chat_id: int
) -> None:
    try:
        fits = not stated_over(file_size, MAX_IMAGE_BYTES)
        data = await download(file_id, MAX_IMAGE_BYTES) if fits else None
    except FileNotRead as exc:
        _not_read(chat_id, "photo", exc)
        out.notes.append(exc.note("The user's photo"))
        return
    if data is None:
        _too_large(chat_id, "photo", MAX_IMAGE_BYTES)
        out.notes.append(too_large_note("The user's photo", MAX_IMAGE_BYTES))
        return
    out.attachments.append(Attachment("image", "photo.jpg", "image/jpeg", data, len(data)))


async def _document(
    out: Extracted,
    file_id: str,
    file_name: str | None,
    mime_type: str | None,
    file_size: int | None,
    *,
    download: Download,
    vision: bool,
    max_bytes: int,
    chat_id: int,
) -> None:
    name = file_name or "document"
    mime = mime_type or mimetypes.guess_type(name)[0] or "application/octet-stream"
    size = file_size or 0
    is_image = mime.startswith("image/") and vision and not stated_over(file_size, MAX_IMAGE_BYTES)
    if not is_image and not is_text_document(mime, name):
        out.attachments.append(Attachment("file", name, mime, size=size))
        return
    limit = MAX_IMAGE_BYTES if is_image else max_bytes
    try:
        data = None if stated_over(file_size, limit) else await download(file_id, limit)
    except FileNotRead as exc:
        _not_read(chat_id, name, exc)
        out.attachments.append(Attachment("file", name, mime, size=size))
        out.notes.append(exc.note(name))
        return
    if data is None:
        _too_large(chat_id, name, limit)
        out.attachments.append(Attachment("file", name, mime, size=size))
        out.notes.append(too_large_note(name, limit))
        return
    if is_image:
        out.attachments.append(Attachment("image", name, mime, data, len(data)))
        return
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        out.attachments.append(Attachment("file", name, mime, size=len(data)))
        out.notes.append(f"[{name} is not UTF-8 text, so it was not read.]")
        return
    out.attachments.append(Attachment("text", name, mime, data, len(data)))


def _too_large(chat_id: int, name: str, limit: int) -> None:
    """The operator's line for a file left unread for its size (the user's is a note in the text)."""
    log.info("telegram_file_too_large", chat_id=chat_id, file=name, limit=limit)


def _not_read(chat_id: int, name: str, exc: FileNotRead) -> None:
    """The operator's line for a file left unread for a reason the user hears in a note."""
    log.info("telegram_file_not_read", chat_id=chat_id, file=name, reason=str(exc))
