"""How much of one model answer the client reads: past these sizes it is a broken server, not a model.

A server or proxy that never stops writing (a local model repeating itself with ``max_tokens``
ignored, a proxy that loops, something that is no model API) was read until the bot ran out of memory
and was killed, every chat with it. The figures sit far above any real answer: the longest a model
writes today is about 128k output tokens, some 0.5 MB of text (3 MB if every character came as a JSON
``\\uXXXX`` escape). Past them the answer is :class:`~bot.errors.LLMBadResponse`, like malformed JSON:
the connection is closed, the next fallback model is asked, and the user reads the usual words.
"""

from __future__ import annotations

import structlog

from bot.errors import LLMBadResponse
from bot.llm.failures import Provider

log = structlog.get_logger(__name__)

MiB = 1024 * 1024

# A whole response body (answers and error bodies alike): ten times the largest real answer, with
# room for image-writing models behind OpenRouter, whose base64 images add a few MB each.
MAX_BODY_BYTES = 32 * MiB

# Text and tool-call arguments of one streamed answer, in characters: about 2 million tokens, sixteen
# times the longest answer a model writes. Reasoning deltas are not kept, so they do not count.
MAX_STREAMED_CHARS = 8 * MiB

# One line of a stream, and one event's data, in characters: as much as a whole body, since some
# compatible servers stream the whole answer as one event. httpx kept a line that never ended, and
# the SSE parser an event whose ``data:`` lines never ended, without limit, before the two above
# counted anything.
MAX_EVENT_CHARS = MAX_BODY_BYTES

# Tool calls of one streamed answer: each costs memory even when it is empty. Real answers hold a
# handful; the tool loop runs at most ``pipeline.tool_loop.MAX_CALLS_PER_ANSWER`` of them anyway.
MAX_STREAMED_CALLS = 10_000


def answer_too_large(what: str, *, model: str, provider: Provider, where: str) -> LLMBadResponse:
    """The error for an answer past a limit above, logged for the operator with the fix.

    ``what`` says what went past the limit ("a body over 32 MiB"). The error is a bad response, so
    the client's failover and the user's plain words are those of any unusable answer.
    """
    fix = (
        f"check that MEMBOT_LLM__{provider.upper()}__BASE_URL points at a model API that stops at "
        "max_tokens (llm.max_output_tokens), and at no proxy in between that loops; a local model "
        "that repeats itself without end needs its server's own output limit, or another model"
    )
    log.error("llm_answer_too_large", model=model, server=where, sent=what, fix=fix)
    return LLMBadResponse(
        f"{where} sent {what} as one answer of {model}, more than any model writes; reading stopped "
        f"and the connection was closed. To fix it, {fix}",
        model=model,
    )
