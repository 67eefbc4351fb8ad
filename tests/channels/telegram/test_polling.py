"""Long polling confirms an update once it is stored, and never takes a redelivered update twice
(channels/telegram/polling.py, channels/telegram/journal.py).

Telegram forgets every update below the offset of the next ``getUpdates`` call and sends every update
above it again; the fake server does the same, so "confirmed" and "delivered again" here mean exactly
what they mean on the real Bot API.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

from bot.domain import InboundMessage
from channels.telegram.journal import JOURNAL_FILE
from tests.bot.test_lifecycle import membot_run
from tests.channels.telegram.kit import RecordingSink, break_folder, running_channel
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.telegram_server import FakeTelegramServer


class BuggySink(RecordingSink):
    """A dispatcher that fails on some messages for a reason other than storage (a bug), a set number
    of times."""

    def __init__(self, failures: dict[str, int]) -> None:
        super().__init__()
        self.failures = failures
        self.attempts: dict[str, int] = {}

    async def submit(self, message: InboundMessage) -> None:
        self.attempts[message.text] = self.attempts.get(message.text, 0) + 1
        if self.attempts[message.text] <= self.failures.get(message.text, 0):
            raise ValueError("cannot handle this message")
        await super().submit(message)


def offsets(tg: FakeTelegramServer) -> list[int | None]:
    return [c.params.get("offset") for c in tg.calls_to("getUpdates")]


def telegram_env(tg: FakeTelegramServer, users: str = '["42"]') -> dict[str, str]:
    return {
        "MEMBOT_TERMINAL__ENABLED": "false",
        "MEMBOT_TELEGRAM__TOKEN": tg.token,
        "MEMBOT_TELEGRAM__BASE_URL": tg.base_url,
        "MEMBOT_TELEGRAM__BASE_FILE_URL": tg.base_file_url,
        "MEMBOT_TELEGRAM__ALLOWED_USERS": users,
        "MEMBOT_TELEGRAM__POLL_TIMEOUT": "1",
    }


async def test_an_update_is_confirmed_at_once_while_its_paste_waits_in_the_join_window(
    tmp_path: Path,
) -> None:
    async with FakeTelegramServer() as tg:
        async with running_channel(tg, tmp_path, join_window=30.0) as (_, sink):
            tg.push_message("part one")
            await tg.wait_for(lambda: 2 in offsets(tg))  # stored, so confirmed: Telegram may forget it
            tg.push_message("part two")  # arrives in a later getUpdates, as from a real client
            tg.push_message("another chat's question", chat_id=778, user_id=43)
            await tg.wait_for(lambda: 4 in offsets(tg))  # the typing chat holds back nobody
            assert sink.received == []  # both still wait in their join windows
            polls = tg.calls_to("getUpdates")
        # Only long polls while messages wait: no short polls to peek for newer updates.
        assert {c.params["timeout"] for c in polls} == {1}
        assert [m.text for m in sink.received] == ["part one\npart two"]  # handed on at stop
        assert tg.calls_to("getUpdates")[-1].params.get("offset") == 4


async def test_an_update_delivered_again_after_a_failed_confirmation_is_taken_once(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg:
        # The call that would confirm update 1 fails, as after a network drop: Telegram keeps it.
        tg.fail("getUpdates", 502, "Bad Gateway", times=1000, when=lambda p: p.get("offset") == 2)
        async with running_channel(tg, tmp_path) as (_, sink):
            tg.push_message("only once")
            await sink.wait_for(1)
            await tg.wait_for(lambda: 2 in offsets(tg))
        tg.failures.clear()
        async with running_channel(tg, tmp_path, sink):
            tg.push_message("sentinel")  # updates are taken in order: once it is in, update 1 was decided
            await sink.wait_for(2)
            await tg.wait_for(lambda: 3 in offsets(tg))
    assert [m.text for m in sink.received] == ["only once", "sentinel"]


async def test_an_update_python_telegram_bot_cannot_read_is_set_aside_and_polling_goes_on(
    tmp_path: Path,
) -> None:
    """A date past the year 9999 makes PTB's parse of the whole batch raise ValueError: polling used to
    stop for every chat, and again after every restart (Telegram keeps the update)."""
    async with FakeTelegramServer() as tg:
        tg.push_message("before", chat_id=701)
        tg.push_message("from the far future", chat_id=702, date=253402300800)
        tg.push_message("after", chat_id=703)
        async with running_channel(tg, tmp_path) as (channel, sink):
            await sink.wait_for(2)
            tg.push_message("later", chat_id=704)
            await sink.wait_for(3)
            assert channel.health.state == "running"
    assert sorted(m.text for m in sink.received) == ["after", "before", "later"]
    assert tg.calls_to("getUpdates")[-1].params.get("offset") == 5  # all four confirmed


async def test_a_failed_hand_over_is_retried(tmp_path: Path) -> None:
    sink = BuggySink({"first": 2})
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, sink) as _:
        tg.push_message("first")
        tg.push_message("second")
        received = await sink.wait_for(2)
    assert sorted(m.text for m in received) == ["first", "second"]  # a retried one may come later
    assert sink.attempts["first"] == 3


async def test_an_update_that_always_fails_is_dropped_after_three_tries_and_the_rest_flows(
    tmp_path: Path,
) -> None:
    sink = BuggySink({"poison": 100})
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, sink) as _:
        tg.push_message("poison")
        tg.push_message("after")
        received = await sink.wait_for(1)
        await sink.wait_until(lambda: sink.attempts.get("poison") == 3)
    assert [m.text for m in received] == ["after"]
    journal = json.loads((tmp_path / JOURNAL_FILE).read_text())
    assert journal["held"] == [] and sorted(journal["done"]) == [1, 2]  # given up, so not taken in again


async def test_a_message_fetched_but_not_yet_queued_when_membot_is_killed_is_answered_after_restart(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    async with FakeTelegramServer() as tg, FakeLLMServer() as llm:
        llm.script(FakeReply(text="here it is"))
        async with membot_run(
            workspace, llm, **telegram_env(tg), MEMBOT_TELEGRAM__JOIN_WINDOW="30"
        ) as service:
            tg.push_message("where is my answer?")
            # confirmed to Telegram, which forgets it: from now on only membot's journal has it
            await tg.wait_for(lambda: 2 in offsets(tg), timeout=30)
            service.process.send_signal(signal.SIGKILL)
            await service.process.wait()
        assert tg.sent_to(777) == []
        async with membot_run(
            workspace, llm, **telegram_env(tg), MEMBOT_TELEGRAM__JOIN_WINDOW="0"
        ) as service:
            [reply] = await tg.wait_for_messages(1, timeout=30)
            assert service.process.returncode is None
    assert reply.text == "here it is"
    assert [r.body["messages"][-1]["content"] for r in llm.requests] == ["where is my answer?"]


async def test_a_message_answered_while_another_chat_types_is_not_answered_again_after_a_kill(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    async with FakeTelegramServer() as tg, FakeLLMServer() as llm:
        env = telegram_env(tg, users='["42", "43"]')
        llm.script(FakeReply(text="answer to the typist"))
        async with membot_run(workspace, llm, **env, MEMBOT_TELEGRAM__JOIN_WINDOW="30") as service:
            tg.push_message("still typing", chat_id=777, user_id=42)  # waits in its join window
            tg.push_message("/help", chat_id=778, user_id=43)  # answered at once
            await tg.wait_for_messages(1, chat_id=778, timeout=30)
            polls = len(offsets(tg))
            await tg.wait_for(lambda: len(offsets(tg)) >= polls + 2, timeout=30)  # a full poll later
            service.process.send_signal(signal.SIGKILL)
            await service.process.wait()
        async with membot_run(workspace, llm, **env, MEMBOT_TELEGRAM__JOIN_WINDOW="0"):
            [answer] = await tg.wait_for_messages(1, chat_id=777, timeout=30)
            polls = len(offsets(tg))
            await tg.wait_for(lambda: len(offsets(tg)) >= polls + 2, timeout=30)
    assert answer.text == "answer to the typist"
    assert len(tg.sent_to(778)) == 1  # Telegram's redelivery (or the journal) did not answer it twice
    assert [r.body["messages"][-1]["content"] for r in llm.requests] == ["still typing"]


async def test_failing_polls_show_as_degraded_until_a_poll_succeeds(tmp_path: Path) -> None:
    """/healthz said 200 "running" while no update could be fetched, and kept the error after."""
    async with FakeTelegramServer() as tg:
        tg.fail("getUpdates", 502, "Bad Gateway", times=2)
        async with running_channel(tg, tmp_path) as (channel, sink):
            await tg.wait_for(lambda: channel.health.state == "degraded")
            assert channel.health.error and "Bad Gateway" in channel.health.error
            tg.push_message("after the outage")
            await sink.wait_for(1)
            assert (channel.health.state, channel.health.error) == ("running", None)


async def answer_a_paste_then_kill_before_its_release(
    workspace: Path, tg: FakeTelegramServer, llm: FakeLLMServer
) -> None:
    """Run the bot until a two-part paste is joined, answered and marked done, while the journal cannot
    note its updates handed over (they stay held); then SIGKILL it and mend the folder."""
    async with membot_run(workspace, llm, **telegram_env(tg), MEMBOT_TELEGRAM__JOIN_WINDOW="1") as service:
        tg.push_message("first half of a paste")
        tg.push_message("second half of a paste")
        await tg.wait_for(lambda: 3 in offsets(tg), timeout=30)  # both held in the journal
        repair = break_folder(workspace / "state")  # the journal cannot note them handed over
        await tg.wait_for_messages(1, timeout=30)  # the joined paste was taken and answered...
        async with asyncio.timeout(30):  # ...and marked done: the inbox cut its file
            while any(f.stat().st_size for f in (workspace / "inbox").glob("*.jsonl")):
                await asyncio.sleep(0.05)
        service.process.send_signal(signal.SIGKILL)
        await service.process.wait()
    repair()


def answered_the_paste_then_the_new_question(tg: FakeTelegramServer, llm: FakeLLMServer) -> None:
    assert [r.body["messages"][-1]["content"] for r in llm.requests] == [
        "first half of a paste\nsecond half of a paste",
        "a new question",
    ]
    assert [m.text for m in tg.sent_to(777)] == [
        "echo: first half of a paste\nsecond half of a paste",
        "echo: a new question",
    ]


async def test_a_paste_handed_over_again_after_a_kill_does_not_swallow_the_next_message(
    tmp_path: Path,
) -> None:
    """Killed after the dispatcher took a joined paste but before the journal noted it handed over, the
    next start hands the paste over again, and the dispatcher knows it (by its first message) and drops
    it. A new message of the same sender must not be joined into that redelivery: it was dropped with it."""
    workspace = tmp_path / "ws"
    async with FakeTelegramServer() as tg, FakeLLMServer() as llm:
        await answer_a_paste_then_kill_before_its_release(workspace, tg, llm)
        tg.push_message("a new question")
        async with membot_run(workspace, llm, **telegram_env(tg), MEMBOT_TELEGRAM__JOIN_WINDOW="5"):
            await tg.wait_for(lambda: any("a new question" in m.text for m in tg.sent_to(777)), timeout=30)
    answered_the_paste_then_the_new_question(tg, llm)


async def test_the_second_half_of_a_paste_handed_over_again_alone_is_not_answered_again(
    tmp_path: Path,
) -> None:
    """The updates of a joined paste are released from the journal one by one. Killed between two of
    those writes, the next start hands over the paste's second half alone: the dispatcher must know it
    as part of the paste it answered, not take it for a new message."""
    workspace = tmp_path / "ws"
    async with FakeTelegramServer() as tg, FakeLLMServer() as llm:
        await answer_a_paste_then_kill_before_its_release(workspace, tg, llm)
        journal = workspace / "state" / JOURNAL_FILE
        data = json.loads(journal.read_text())
        assert [u["update_id"] for u in data["held"]] == [1, 2]
        data["held"], data["done"] = data["held"][1:], [*data["done"], 1]  # the first release landed
        journal.write_text(json.dumps(data))
        tg.push_message("a new question")
        async with membot_run(workspace, llm, **telegram_env(tg), MEMBOT_TELEGRAM__JOIN_WINDOW="0"):
            await tg.wait_for(lambda: any("a new question" in m.text for m in tg.sent_to(777)), timeout=30)
    answered_the_paste_then_the_new_question(tg, llm)
