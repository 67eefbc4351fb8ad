"""Writes held up by a full disk try again as soon as another write goes through.

A write the disk refused (a done mark, a session save) waited out its pause (2 s doubling to 60 s)
even after the operator freed space and other chats' writes went through again: its chat waited for
nothing, and a kill in that window left a sent answer without its done mark, so the next start sent
it again. Now the write that goes through wakes the ones that wait (bot/dispatcher/delivery.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from bot.commands import CommandRouter
from bot.config import DispatcherSettings
from bot.dispatcher import Dispatcher
from bot.domain import OutboundMessage
from bot.inbox import Inbox
from bot.retry import Backoff
from bot.session_service import SessionService
from bot.sessions import JsonSessionStore
from channels.base import InboundSink
from pipeline import Pipeline
from tests.bot.test_dispatcher import ModelSystem
from tests.bot.test_dispatcher_recovery import msg, settled
from tests.channels.telegram.kit import break_folder
from tests.recording import RecordingChannel

LONG = Backoff(300.0, 300.0)  # a pause no test waits out: a write tried again in time was woken


class FillingChannel(RecordingChannel):
    """Sends replies; once the first has gone out, the disk under ``folder`` refuses every write (a full
    disk between the send and its done mark)."""

    def __init__(self, submit: InboundSink, folder: Path) -> None:
        super().__init__(submit)
        self._folder = folder
        self.repair: Callable[[], None] | None = None

    async def send(self, message: OutboundMessage) -> None:
        await super().send(message)
        if self.repair is None:
            self.repair = await asyncio.to_thread(break_folder, self._folder)


async def test_a_done_mark_waiting_for_storage_is_written_once_another_write_goes_through(
    tmp_path: Path,
) -> None:
    model = ModelSystem()
    dispatcher = Dispatcher(
        Pipeline([model]),
        SessionService(JsonSessionStore(tmp_path / "sessions")),
        CommandRouter(),
        DispatcherSettings(),
        inbox=Inbox(tmp_path / "inbox"),
        retry=LONG,
    )
    await dispatcher.recover()
    channel = FillingChannel(dispatcher.submit, tmp_path / "inbox")
    dispatcher.attach(channel)
    await dispatcher.submit(msg("first", message_id="1", chat="c1"))
    await channel.wait_for(1)
    async with asyncio.timeout(10):
        while dispatcher.storage_wait("test:c1") != "inbox_done_mark":  # sent, its done mark refused
            await asyncio.sleep(0.01)
    assert channel.repair is not None
    await asyncio.to_thread(channel.repair)  # the operator frees space; c1's done mark sits in a 300 s pause
    await dispatcher.submit(msg("second", message_id="2", chat="c2"))  # its writes go through
    answers = await channel.wait_for(2)
    assert [a.text for a in answers] == ["answer to first", "answer to second"]
    async with asyncio.timeout(5):  # far short of the pause: the done mark was woken, not timed out
        await settled(tmp_path)  # nothing pending: a kill now sends no answer again
    assert dispatcher.storage_waits() == {}
    await dispatcher.close(grace=1)
    assert model.seen == ["first", "second"] and len(channel.sent) == 2
