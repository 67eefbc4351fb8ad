"""Bodies from other servers, read no further than a cap.

A server that never stops writing (a model repeating itself with ``max_tokens`` ignored, a proxy that
loops, a file server sending more than the size it stated) was read until the bot ran out of memory
and was killed, every chat with it. Every body read whole from another server goes through
:func:`read_at_most`: the model client's answers (bot/llm/limits.py has their caps), the embeddings
endpoint's, ``membot doctor``'s probes, and the files users send (channels/downloads.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator


async def read_at_most(chunks: AsyncIterator[bytes], limit: int) -> bytes | None:
    """The whole body, or None as soon as it passes ``limit`` bytes: reading stops there, and the
    caller, who closes the response, drops the connection instead of draining the rest."""
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)
