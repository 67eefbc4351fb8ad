"""What one LLM request costs besides the network, checked by counting, never by timing.

Per-request work shows up in every turn, so it is pinned down here: a warm request must not make
Python search for modules (a failed import is not cached and scans sys.path every time).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

import pytest

from bot.domain import Message, Role
from bot.llm import ChatRequest

both = pytest.mark.parametrize("api", ["openai", "anthropic"])


class _Lookups(MetaPathFinder):
    """Records every module name Python looks for; finds nothing itself."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        self.names.append(fullname)
        return None


@contextmanager
def module_lookups() -> Iterator[list[str]]:
    finder = _Lookups()
    sys.meta_path.insert(0, finder)
    try:
        yield finder.names
    finally:
        sys.meta_path.remove(finder)


@both
async def test_a_warm_request_imports_nothing(make_client: Any, api: str) -> None:
    # httpcore imports sniffio in every lock and event it sets up; without sniffio installed each of
    # those is a failed import, i.e. a sys.path scan, several times per request (encode/httpcore#1103).
    llm, _ = make_client(api)
    request = ChatRequest(messages=(Message(Role.USER, "hi"),), system="be brief")
    await llm.chat(request)  # warm: first-use imports are fine
    with module_lookups() as looked_up:
        await llm.chat(request)
        await llm.chat(request)
    assert looked_up == []
