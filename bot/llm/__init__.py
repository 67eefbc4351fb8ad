"""Talking to language models over HTTP (OpenAI-compatible and Anthropic), with no vendor SDK."""

from bot.llm.client import LLMClient, UsageObserver
from bot.llm.endpoints import check_base_url
from bot.llm.estimates import request_tokens, schemas_text
from bot.llm.failures import Provider
from bot.llm.model import ChatModel
from bot.llm.stats import LLMStats
from bot.llm.transport import llm_http_client
from bot.llm.types import ChatRequest, ChatResponse, Purpose, StreamEvent, ToolSpec

__all__ = [
    "ChatModel",
    "ChatRequest",
    "ChatResponse",
    "LLMClient",
    "LLMStats",
    "Provider",
    "Purpose",
    "StreamEvent",
    "ToolSpec",
    "UsageObserver",
    "check_base_url",
    "llm_http_client",
    "request_tokens",
    "schemas_text",
]
