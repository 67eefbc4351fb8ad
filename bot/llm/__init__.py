"""Talking to language models over HTTP (OpenAI-compatible and Anthropic), with no vendor SDK."""

from bot.llm.client import LLMClient
from bot.llm.stats import LLMStats
from bot.llm.types import ChatRequest, ChatResponse, StreamEvent, ToolSpec

__all__ = ["ChatRequest", "ChatResponse", "LLMClient", "LLMStats", "StreamEvent", "ToolSpec"]
