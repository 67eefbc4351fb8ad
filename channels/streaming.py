"""Writing a reply into one chat message while the model is still producing it.

Telegram and Discord both show a streamed reply the same way: the first partial answer is posted as a
new message, later ones edit it, and the final reply edits it once more. Edits are rate-limited by both
services, so they are throttled to one per interval (the final reply corrects whatever a skipped edit
would have shown), an edit that would not change the text is skipped, and a failure is never fatal:
streaming is best effort, the final reply is what must arrive. What differs per service (how a
preview is rendered, sent and edited, which errors count, and whether to keep trying after one) is
passed in, so the throttling lives in one place.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

M = TypeVar("M")  # how the service identifies the posted message (an id, a message object)
P = TypeVar("P")  # one rendered preview


class StreamedMessage(Generic[M, P]):
    """The one message a partial reply is shown in; :meth:`show` is the channel's ``PartialSink``.

    Args:
        render: the preview of the text so far (the first chunk, rendered), or None if nothing to show.
        shown_as: the text a preview puts on screen, to skip edits that would change nothing.
        post: send the first preview as a new message; returns that message.
        edit: rewrite the message with a newer preview.
        interval: seconds between edits at the least.
        clock: a monotonic clock.
        errors: the failures of ``post``/``edit`` that streaming tolerates (anything else propagates).
        on_error: told about each tolerated failure (to log it).
        keep_trying: after a failure, whether later previews try again; if not, the stream stops and
            :attr:`message` is None from then on: the final reply is not edited into it through the
            stream (Discord's looks the preview up in its record instead, and goes out as new messages
            only if that edit fails too).
        gives_up: whether a failure ends the tries even so (the chat refuses the bot for good, so every
            later preview of the turn would be refused too); :attr:`message` stays, for the final reply.
    """

    def __init__(
        self,
        *,
        render: Callable[[str], P | None],
        shown_as: Callable[[P], str],
        post: Callable[[P], Awaitable[M]],
        edit: Callable[[M, P], Awaitable[None]],
        interval: float,
        clock: Callable[[], float],
        errors: tuple[type[Exception], ...],
        on_error: Callable[[Exception], None],
        keep_trying: bool,
        gives_up: Callable[[Exception], bool] = lambda exc: False,
    ) -> None:
        self._render = render
        self._shown_as = shown_as
        self._post = post
        self._edit = edit
        self._interval = interval
        self._clock = clock
        self._errors = errors
        self._on_error = on_error
        self._keep_trying = keep_trying
        self._gives_up = gives_up
        self._message: M | None = None
        self._last_edit = -math.inf
        self._broken = False
        self._stopped = False  # no more previews; unlike broken, the final reply may still edit the message
        self.shown = ""  # what the message says now

    @property
    def message(self) -> M | None:
        """The message the final reply should edit in place, or None if it must be sent anew."""
        return None if self._broken else self._message

    async def show(self, text_so_far: str) -> None:
        if self._broken or self._stopped:
            return
        now = self._clock()
        # Throttle before rendering: rendering the whole text on every token would cost more than it shows.
        if self._message is not None and now - self._last_edit < self._interval:
            return  # the final reply edits the message anyway
        preview = self._render(text_so_far)
        if preview is None:
            return
        shown = self._shown_as(preview)
        if shown == self.shown:
            return
        self._last_edit = now
        try:
            if self._message is None:
                self._message = await self._post(preview)
            else:
                await self._edit(self._message, preview)
        except self._errors as exc:
            self._broken = not self._keep_trying
            self._stopped = self._gives_up(exc)
            self._on_error(exc)
            return
        self.shown = shown
