"""Shared pieces of the compaction and session-command tests: an honest Retirer, clients, histories."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from bot.catalog import ModelCatalog
from bot.config import LLMSettings
from bot.domain import Message, Role, Session, ToolCall
from bot.llm import LLMClient, UsageObserver
from tests.fakes.llm_server import FakeLLMServer


class RecordingRetirer:
    """A Retirer that keeps what it was given (a stand-in for memory) and can refuse."""

    def __init__(self, *, accept: bool = True) -> None:
        self.accept = accept
        self.retired: list[list[Message]] = []
        self.still_in_session: list[bool] = []

    async def retire(self, session: Session, messages: Sequence[Message]) -> bool:
        ids = {m.id for m in session.messages}
        self.still_in_session.append(all(m.id in ids for m in messages))
        if self.accept:
            self.retired.append(list(messages))
        return self.accept


def llm_client(
    server: FakeLLMServer,
    catalog: ModelCatalog,
    http: httpx.AsyncClient,
    *,
    usage: UsageObserver | None = None,
    **settings: Any,
) -> LLMClient:
    values: dict[str, Any] = {
        "model": "gpt-4.1",
        "openai": {"base_url": server.openai_base_url, "api_key": "sk-test-openai"},
        "timeout": 5.0,
        "max_retries": 0,
    }
    values.update(settings)
    return LLMClient(LLMSettings.model_validate(values), catalog, http, usage=usage)


def conversation(n: int, *, words: int = 8) -> list[Message]:
    """``n`` alternating user/assistant messages with numbered, distinct text."""
    filler = " ".join(f"w{j}" for j in range(words))
    return [Message(Role.USER if i % 2 == 0 else Role.ASSISTANT, f"message {i}: {filler}") for i in range(n)]


def tool_exchange(call_id: str, *names: str) -> list[Message]:
    calls = tuple(ToolCall(f"{call_id}-{k}", name, '{"q": 1}') for k, name in enumerate(names))
    out = [Message(Role.ASSISTANT, "", tool_calls=calls)]
    out += [
        Message(Role.TOOL, f"result of {c.name} SECRET-RESULT", tool_call_id=c.id, name=c.name) for c in calls
    ]
    return out


def pairs_intact(messages: Sequence[Message]) -> bool:
    """Every tool result follows its call, and every call has all its results, in ``messages``."""
    open_calls: set[str] = set()
    for m in messages:
        if m.role is Role.TOOL:
            if m.tool_call_id not in open_calls:
                return False
            open_calls.discard(m.tool_call_id)
            continue
        if open_calls:
            return False  # a call left without its result before the next message
        open_calls = {c.id for c in m.tool_calls}
    return not open_calls
