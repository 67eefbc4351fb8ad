"""Shared pieces for memory tests: a settable clock, a fresh memory folder, an LLM over the fake, and
items said some days before a given moment."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest

from bot.catalog import load_catalog
from bot.config import LLMSettings, MemorySettings
from bot.llm import LLMClient
from bot.memory import MemoryService
from bot.memory.items import ItemType, Layer, MemoryItem, Reference
from tests.fakes.llm_server import FakeLLMServer

UTC_ZONE = ZoneInfo("UTC")


def said_before(
    now: datetime,
    content: str,
    *,
    days_ago: float = 0,
    layer: Layer = Layer.EPISODIC,
    type: ItemType = ItemType.EPISODE,
    ref: str = "",
    tags: tuple[str, ...] = ("user",),
    salience: float = 0.5,
    source: str = "heuristic",
) -> MemoryItem:
    """An item of ``content`` said ``days_ago`` days before ``now``, from the message ``ref`` (else one
    named after its first words) of the chat cli:me."""
    at = now - timedelta(days=days_ago)
    return MemoryItem(
        layer=layer,
        type=type,
        title=content[:30],
        content=content,
        created_at=at,
        updated_at=at,
        last_accessed_at=at,
        tags=tags,
        salience=salience,
        source=source,
        references=(Reference("cli:me", ref or content[:12]),),
    )


CATALOG = load_catalog()  # read at import: blocking file I/O is not allowed inside the test's loop


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, start: datetime = datetime(2024, 5, 20, 9, 30, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLMServer]:
    async with FakeLLMServer() as server:
        yield server


@pytest.fixture
async def llm(fake_llm: FakeLLMServer) -> AsyncIterator[LLMClient]:
    settings = LLMSettings.model_validate(
        {
            "model": "gpt-4.1-mini",
            "openai": {"base_url": fake_llm.openai_base_url, "api_key": "sk-test"},
            "timeout": 10.0,
            "max_retries": 0,
        }
    )
    async with httpx.AsyncClient() as http:
        yield LLMClient(settings, CATALOG, http)


async def make_memory(root: Path, clock: Clock, llm: Any = None, **settings: Any) -> MemoryService:
    service = MemoryService(
        root / "memory", MemorySettings.model_validate(settings), timezone="UTC", llm=llm, clock=clock
    )
    await service.start()
    return service


@pytest.fixture
async def memory(tmp_path: Path, clock: Clock) -> AsyncIterator[MemoryService]:
    service = await make_memory(tmp_path, clock)
    yield service
    await service.close()
