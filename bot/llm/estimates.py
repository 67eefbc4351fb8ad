"""Usage a server did not count: the call's tokens as membot's own counter counts them.

The client asks for usage (OpenAI's ``stream_options.include_usage``; Anthropic sends it unasked), but
some OpenAI-compatible servers never send it, and a stream taken whole at its stop reason (its end
marker never came: streaming.py) may have lost the chunk that carried it. Counted as 0, such calls
were missing from the usage ledger and ``/status``: spend under-reported without a word. Such a call
is counted as the context budget counts a prompt instead (bot/tokens.py, in the basis encoding times
the counter's prior: there is no session to calibrate by here), and its ``Usage`` says how many
calls were estimated, so calibration never takes an estimate for the provider's count.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from bot.llm.types import ChatRequest, ChatResponse, ToolSpec
from bot.tokens import TokenCounter


def schemas_text(tools: Sequence[ToolSpec]) -> str:
    """The tool schemas as counted: the JSON of what a request sends for them."""
    return json.dumps(
        [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools]
    )


def request_tokens(counter: TokenCounter, request: ChatRequest) -> int:
    """Basis tokens of a request as sent (uncalibrated): system prompt, tool schemas and messages."""
    raw = counter.count_text(request.system) if request.system else 0
    raw += counter.count_text(schemas_text(request.tools)) if request.tools else 0
    return raw + counter.messages_tokens(request.messages)


def answer_tokens(counter: TokenCounter, response: ChatResponse) -> int:
    """Basis tokens of an answer: its text and its tool calls' names and arguments."""
    raw = counter.count_text(response.content)
    return raw + sum(
        counter.count_text(c.name) + counter.count_text(c.arguments) for c in response.tool_calls
    )


def fill_missing(counter: TokenCounter, request: ChatRequest, response: ChatResponse) -> list[str]:
    """Put an estimate where the server counted nothing; the fields estimated (none: it counted all).

    No prompt is 0 tokens, and no answer with a word or a call in it is: a 0 there is a count that
    did not come (or was no count, ``llm_usage_malformed``)."""
    usage = response.usage
    estimated = []
    if usage.input_tokens <= 0:
        usage.input_tokens = max(1, round(request_tokens(counter, request) * counter.prior))
        estimated.append("input_tokens")
    if usage.output_tokens <= 0 and (response.content or response.tool_calls):
        usage.output_tokens = max(1, round(answer_tokens(counter, response) * counter.prior))
        estimated.append("output_tokens")
    if estimated:
        usage.estimated_calls = max(1, usage.calls)
    return estimated
