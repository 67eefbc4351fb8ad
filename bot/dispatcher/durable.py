"""Waiting for an inbox line that is on its way to the disk, whatever happens to the waiter.

A message the inbox took is written whatever its caller does (bot/group_writer.py): the
caller must then finish taking it (queue it) even when it is cancelled meanwhile, or it is half taken.
"""

from __future__ import annotations

import asyncio


async def through_cancel(durable: asyncio.Future[None]) -> asyncio.CancelledError | None:
    """Wait for an inbox line to be written even when the caller is cancelled meanwhile; returns the
    cancel, to raise once the message is queued. The line reaches the disk whatever the caller does
    (bot/group_writer.py), so a message given up here was half taken: pending with no lane to answer
    it (its redelivery ignored as known), or forgotten by the inbox but on disk, answered as new when
    handed over again and once more by the next start. (The Discord channel cancels its catch-up when
    a new gateway session replaces the one it read for.) A write that failed raises, or the cancel."""
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            await asyncio.shield(durable)
            return cancelled
        except asyncio.CancelledError as exc:
            if durable.cancelled():  # the write itself was (the loop is closing): nothing to finish
                raise
            cancelled = exc
        except Exception:
            if cancelled is not None:
                raise cancelled from None
            raise
