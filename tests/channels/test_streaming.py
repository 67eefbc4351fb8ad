"""The throttled "stream into one message" helper shared by Telegram and Discord (channels/streaming.py)."""

from __future__ import annotations

import pytest

from channels.streaming import StreamedMessage


class Screen:
    """A fake service: posts and edits are recorded; ``fail`` makes the next call raise."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[tuple[str, str]] = []
        self.fail: Exception | None = None
        self.errors: list[Exception] = []

    async def post(self, preview: str) -> int:
        self._maybe_fail()
        self.calls.append(("post", preview))
        return 42

    async def edit(self, message: int, preview: str) -> None:
        assert message == 42
        self._maybe_fail()
        self.calls.append(("edit", preview))

    def _maybe_fail(self) -> None:
        if self.fail is not None:
            exc, self.fail = self.fail, None
            raise exc

    def stream(self, *, keep_trying: bool, interval: float = 1.0) -> StreamedMessage[int, str]:
        return StreamedMessage(
            render=lambda text: text[:10] or None,
            shown_as=lambda preview: preview,
            post=self.post,
            edit=self.edit,
            interval=interval,
            clock=lambda: self.now,
            errors=(ConnectionError,),
            on_error=self.errors.append,
            keep_trying=keep_trying,
        )


async def test_posts_once_then_edits_at_most_every_interval() -> None:
    screen = Screen()
    stream = screen.stream(keep_trying=True)
    await stream.show("")  # nothing to show yet
    await stream.show("a")
    await stream.show("ab")  # throttled
    screen.now = 1.0
    await stream.show("abc")
    assert screen.calls == [("post", "a"), ("edit", "abc")]
    assert stream.message == 42 and stream.shown == "abc"


async def test_an_unchanged_preview_is_no_edit() -> None:
    screen = Screen()
    stream = screen.stream(keep_trying=True, interval=0.0)
    await stream.show("0123456789")
    await stream.show("0123456789 and more")  # the preview (first ten characters) did not change
    assert screen.calls == [("post", "0123456789")]


async def test_keep_trying_retries_with_the_next_partial() -> None:
    screen = Screen()
    stream = screen.stream(keep_trying=True, interval=0.0)
    screen.fail = ConnectionError("down")
    await stream.show("a")
    assert stream.message is None and len(screen.errors) == 1
    await stream.show("ab")
    assert screen.calls == [("post", "ab")] and stream.message == 42


async def test_without_keep_trying_a_failure_ends_the_stream() -> None:
    screen = Screen()
    stream = screen.stream(keep_trying=False, interval=0.0)
    await stream.show("a")
    screen.fail = ConnectionError("down")
    await stream.show("ab")
    await stream.show("abc")
    assert screen.calls == [("post", "a")]
    assert stream.message is None  # the final reply goes out as new messages


async def test_other_errors_propagate() -> None:
    screen = Screen()
    stream = screen.stream(keep_trying=True)
    screen.fail = ValueError("a bug")
    with pytest.raises(ValueError):
        await stream.show("a")
