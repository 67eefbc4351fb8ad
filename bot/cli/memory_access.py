"""How a ``membot memory`` command opens memory: as the bot's own files, beside a running bot that
owns them, and found by meaning as the bot finds it.

A concept of its own, apart from the commands (memory.py) that print what they get: every command opens
memory the same way (read-only unless it writes, closed on every exit), and the two that find memory
(``show`` and ``search``) must build the bot's embedding model and say what the meaning side missed in
one place, or they would find differently from each other and from the bot. Like the rest of this
package it imports memory (numpy, simplemma) and httpx only inside its functions, so that
``membot --help`` stays fast.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TypeVar

from bot.errors import ConfigError

if TYPE_CHECKING:
    import httpx

    from bot.config import Settings
    from bot.memory import Embedder, MemoryService, VectorStore

T = TypeVar("T")


@asynccontextmanager
async def open_service(
    settings: Settings, *, read_only: bool, embedder: Embedder | None = None
) -> AsyncIterator[MemoryService]:
    """Memory opened for a command: ``read_only`` beside a running bot, which owns the files (these
    commands take no workspace lock), so that a look changes nothing in the workspace. With an
    ``embedder`` (read-only) it also reads the bot's vectors of that model, to search by meaning."""
    from bot.memory import MemoryService

    service = MemoryService(
        settings.memory_dir,
        settings.memory,
        timezone=settings.timezone,
        embedder=embedder,
        read_only=read_only,
    )
    await service.start()
    try:
        yield service
    finally:
        await service.close()


def run_on_memory(
    settings: Settings, work: Callable[[MemoryService], Awaitable[T]], *, read_only: bool = True
) -> T:
    """``work`` done on memory opened for it (:func:`open_service`), from a command (no loop running)."""

    async def main() -> T:
        async with open_service(settings, read_only=read_only) as service:
            return await work(service)

    return asyncio.run(main())


def run_finding(
    settings: Settings, work: Callable[[MemoryService], Awaitable[T]], *, session_id: str | None
) -> tuple[T, str | None]:
    """:func:`run_on_memory` (read-only) for ``work`` that finds memory as the bot does, by words and by
    meaning: with the bot's embedding model for the query and its vectors, read as they are. Also returns
    what the operator should know about the meaning side (the search of ``session_id``), or None."""
    import httpx

    from bot.memory import operator as ops

    async def main() -> tuple[T, str | None]:
        async with httpx.AsyncClient() as http:
            embedder, note = _query_embedder(settings, http)
            async with open_service(settings, read_only=True, embedder=embedder) as service:
                done = await work(service)
                if service.vectors is not None:
                    note = _meaning_note(service.vectors, ops.unembedded(service, session_id=session_id))
        return done, note

    return asyncio.run(main())


def _query_embedder(settings: Settings, http: httpx.AsyncClient) -> tuple[Embedder | None, str | None]:
    """The bot's embedding model, to embed a query; or None and why the search is by words only."""
    from bot.memory import build_embedder

    if settings.memory.embeddings == "none":
        return None, 'found by words only: memory.embeddings is "none"'
    try:
        return build_embedder(settings.memory, http), None
    except ConfigError as exc:
        return None, f"found by words only: {exc}"


def _meaning_note(vectors: VectorStore, unembedded: int | None) -> str | None:
    """What the operator should know about the meaning side of a search just made."""
    if vectors.query_failure is not None:
        return f"found by words only, as the embedding model gave no vector: {vectors.query_failure}"
    if unembedded:
        if unembedded == 1:
            said = "1 item has no vector yet, so it is found by its words only: the running bot embeds it"
        else:
            said = (
                f"{unembedded} items have no vector yet, so they are found by their words only: "
                "the running bot embeds them"
            )
        return f"{said}, or run `membot memory reindex`"
    return None
