"""Fixtures for the LLM client tests: the fake server, a real httpx client, and a client factory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from bot.catalog import ModelCatalog
from bot.config import LLMSettings
from bot.llm import LLMClient
from tests.fakes.llm_server import FakeLLMServer

MODELS = {"openai": "gpt-4.1-mini", "anthropic": "claude-haiku-4-5"}


class Sleeps:
    """An injected ``sleep`` that records the delays instead of waiting them out."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


MakeClient = Callable[..., tuple[LLMClient, Sleeps]]


@pytest.fixture
def make_client(server: FakeLLMServer, http: httpx.AsyncClient, catalog: ModelCatalog) -> MakeClient:
    """``make_client("openai", max_retries=1)``: an LLMClient aimed at the fake, jitter fixed at 0.5."""

    def build(api: str, **settings: Any) -> tuple[LLMClient, Sleeps]:
        values: dict[str, Any] = {
            "model": MODELS[api],
            "openai": {"base_url": server.openai_base_url, "api_key": "sk-test-openai"},
            "anthropic": {"base_url": server.anthropic_base_url, "api_key": "sk-ant-test"},
            "timeout": 5.0,
        }
        values.update(settings)
        sleeps = Sleeps()
        client = LLMClient(LLMSettings.model_validate(values), catalog, http, sleep=sleeps, rng=lambda: 0.5)
        return client, sleeps

    return build
