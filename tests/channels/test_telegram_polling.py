"""Long polling confirms an update only once it is queued: a kill, a crash or a failed hand-over never
loses a Telegram message (channels/telegram_polling.py).

Telegram forgets every update below the offset of the next ``getUpdates`` call; the fake server does
the same, so "not confirmed" here means exactly what it means on the real Bot API.
"""

from __future__ import annotations

import signal
from pathlib import Path

from bot.domain import InboundMessage
from tests.bot.test_lifecycle import membot_run
from tests.channels.telegram_kit import RecordingSink, running_channel
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.telegram_server import FakeTelegramServer


class FlakySink(RecordingSink):
    """A dispatcher whose inbox write fails for some messages (disk full, say) a set number of times."""

    def __init__(self, failures: dict[str, int]) -> None:
        super().__init__()
        self.failures = failures
        self.attempts: dict[str, int] = {}

    async def submit(self, message: InboundMessage) -> None:
        self.attempts[message.text] = self.attempts.get(message.text, 0) + 1
        if self.attempts[message.text] <= self.failures.get(message.text, 0):
            raise OSError(28, "No space left on device")
        await super().submit(message)


def offsets(tg: FakeTelegramServer) -> list[int | None]:
    return [c.params.get("offset") for c in tg.calls_to("getUpdates")]


async def test_a_failed_hand_over_is_retried_before_the_update_is_confirmed(tmp_path: Path) -> None:
    sink = FlakySink({"first": 2})
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, sink) as _:
        tg.push_message("first")
        tg.push_message("second")
        received = await sink.wait_for(2)
        await tg.wait_for(lambda: 3 in offsets(tg))
    assert sorted(m.text for m in received) == ["first", "second"]  # a retried one may come later
    assert sink.attempts["first"] == 3
    assert offsets(tg).index(3) > offsets(tg).index(1)  # held at 1 while "first" kept failing


async def test_an_update_that_always_fails_is_dropped_after_three_tries_and_the_rest_flows(
    tmp_path: Path,
) -> None:
    sink = FlakySink({"poison": 100})
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, sink) as _:
        tg.push_message("poison")
        tg.push_message("after")
        received = await sink.wait_for(1)
        await tg.wait_for(lambda: 3 in offsets(tg))  # confirmed only once "poison" was given up
    assert [m.text for m in received] == ["after"]
    assert sink.attempts["poison"] == 3


async def test_a_split_paste_is_still_joined_while_its_first_part_holds_the_offset(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, join_window=0.6) as (_, sink):
        tg.push_message("part one")
        await tg.wait_for(lambda: 1 in offsets(tg))  # part one fetched, the offset held at it
        tg.push_message("part two")  # arrives in a later getUpdates, as from a real client
        [joined] = await sink.wait_for(1)
        await tg.wait_for(lambda: 3 in offsets(tg))
    assert joined.text == "part one\npart two"


async def test_a_message_fetched_but_not_yet_queued_when_membot_is_killed_is_answered_after_restart(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    async with FakeTelegramServer() as tg, FakeLLMServer() as llm:
        llm.script(FakeReply(text="here it is"))
        telegram = {
            "MEMBOT_TERMINAL__ENABLED": "false",
            "MEMBOT_TELEGRAM__TOKEN": tg.token,
            "MEMBOT_TELEGRAM__BASE_URL": tg.base_url,
            "MEMBOT_TELEGRAM__BASE_FILE_URL": tg.base_file_url,
            "MEMBOT_TELEGRAM__ALLOWED_USERS": '["42"]',
            "MEMBOT_TELEGRAM__POLL_TIMEOUT": "1",
        }
        async with membot_run(workspace, llm, **telegram, MEMBOT_TELEGRAM__JOIN_WINDOW="30") as service:
            before = len(offsets(tg))
            tg.push_message("where is my answer?")
            # a poll that began after the one that fetched it: the message now sits in its join window
            await tg.wait_for(lambda: len(offsets(tg)) >= before + 2, timeout=30)
            service.process.send_signal(signal.SIGKILL)
            await service.process.wait()
        assert tg.sent_to(777) == [] and 2 not in offsets(tg)
        async with membot_run(workspace, llm, **telegram, MEMBOT_TELEGRAM__JOIN_WINDOW="0") as service:
            [reply] = await tg.wait_for_messages(1, timeout=30)
            assert service.process.returncode is None
    assert reply.text == "here it is"
    assert [r.body["messages"][-1]["content"] for r in llm.requests] == ["where is my answer?"]
