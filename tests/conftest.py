"""Shared test set-up: blocking I/O on the event loop fails any test that does it from our code."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from zoneinfo import ZoneInfo

import httpx
import hypothesis  # noqa: F401  (imported up front: CPython 3.11.7 can crash rewriting it lazily mid-run)
import pytest
from blockbuster import BlockBuster, blockbuster_ctx

from bot.catalog import ModelCatalog, load_catalog
from bot.llm import llm_http_client
from bot.logging import configure_logging
from tests.fakes.llm_server import FakeLLMServer


@pytest.fixture(autouse=True, scope="session")
def _logging() -> None:
    """Tests log as production does off a terminal (JSON lines, tracebacks as text, redaction on)."""
    configure_logging(level="DEBUG", fmt="json")
    # markdown-it logs every parsing rule at DEBUG; that alone made rendering tests 3x slower.
    logging.getLogger("markdown_it").setLevel(logging.INFO)


@pytest.fixture(autouse=True, scope="session")
def _zones() -> None:
    """The bot's settings check loads its time zone before its loop starts (bot/config.py), so the
    services it builds on the loop find it loaded; tests that build them on theirs get the same start
    (else only a test that ran after another one that loaded it would pass)."""
    ZoneInfo("UTC")


@pytest.fixture(autouse=True)
def blockbuster() -> Iterator[BlockBuster | None]:
    """STYLE 15: bot, pipeline and channels must keep file and socket I/O off the loop."""
    with blockbuster_ctx(["bot", "pipeline", "channels"]) as bb:
        # Logging to the captured stream is a memory write in tests and a deliberate trade-off in prod.
        for name in ("io.TextIOWrapper.write", "io.BufferedWriter.write"):
            if name in bb.functions:
                bb.functions[name].can_block_in("logging/__init__.py", "emit")
        # Rendering a traceback for log.exception reads source lines; that is the logging layer's cost.
        for name in ("os.stat", "io.BufferedReader.read", "io.TextIOWrapper.read"):
            if name in bb.functions:
                bb.functions[name].can_block_in("linecache.py", {"checkcache", "updatecache"})
        yield bb


@pytest.fixture
async def server() -> AsyncIterator[FakeLLMServer]:
    """A fresh fake model server (OpenAI and Anthropic wire formats) on a random loopback port."""
    async with FakeLLMServer() as llm:
        yield llm


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """The model's HTTP client, as the bot builds it (bot/llm/transport.py)."""
    async with await asyncio.to_thread(llm_http_client) as client:  # (imports aiohttp: off the loop)
        yield client


@pytest.fixture(scope="session")
def catalog() -> ModelCatalog:
    return load_catalog()
