"""Service lifecycle: start-up order and channel failures, graceful shutdown, the second signal.

The first part drives :class:`ServiceRunner` in-process with honest recording channels and dispatcher;
the second runs the real ``membot run`` as a subprocess against the fake LLM and signals it.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from bot.config import LifecycleSettings
from bot.domain import OutboundMessage
from bot.errors import ChannelError
from bot.inbox import Inbox
from bot.lifecycle import EXIT_CHANNEL_FAILED, EXIT_OK, GC_THRESHOLDS, ServiceRunner
from channels.base import Channel
from tests.bot.membot_service import membot_run, session_headers_parse, stored, wait_in_flight
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.telegram_server import FakeTelegramServer

# ---- in-process: the runner with recording parts ----------------------------------------------------


class RecordingChannel(Channel):
    name: ClassVar[str] = "rec"

    def __init__(self, label: str, log: list[str], *, fail: Exception | None = None) -> None:
        async def submit(message: object) -> None:
            return None

        super().__init__(submit)
        self.label = label
        self._log = log
        self._fail = fail

    async def start(self) -> None:
        self._log.append(f"start {self.label}")
        if self._fail is not None:
            raise self._fail
        self.health.state = "running"

    async def stop(self) -> None:
        self._log.append(f"stop {self.label}")
        self.health.state = "stopped"

    async def send(self, message: OutboundMessage) -> None:
        return None


class RecordingDispatcher:
    def __init__(self, log: list[str]) -> None:
        self._log = log
        self.release = asyncio.Event()
        self.release.set()
        self.closing = asyncio.Event()

    async def recover(self) -> int:
        self._log.append("recover")
        return 0

    async def close(self, grace: float) -> None:
        self._log.append(f"close {grace:g}")
        self.closing.set()
        await self.release.wait()


def starter(log: list[str], failing: dict[str, Exception] | None = None):  # type: ignore[no-untyped-def]
    channels: dict[str, RecordingChannel] = {}

    async def start(name: str) -> Channel:
        channel = RecordingChannel(name, log, fail=(failing or {}).get(name))
        channels[name] = channel
        await channel.start()
        return channel

    return start


async def test_shutdown_drains_then_flushes_then_stops_channels_in_reverse() -> None:
    log: list[str] = []
    runner = ServiceRunner(LifecycleSettings(grace_period=7), signals=())

    async def flush() -> None:
        log.append("flush memory")

    dispatcher = RecordingDispatcher(log)
    task = asyncio.create_task(
        runner.run(["a", "b"], start_channel=starter(log), dispatcher=dispatcher, flushers=[flush])
    )
    while "start b" not in log:
        await asyncio.sleep(0)
    assert {n: h.state for n, h in runner.channel_health().items()} == {"a": "running", "b": "running"}
    runner.request_stop()
    assert await task == EXIT_OK
    assert log == ["recover", "start a", "start b", "close 7", "flush memory", "stop b", "stop a"]


@pytest.fixture
def unfrozen_gc() -> Iterator[None]:
    """Start with nothing frozen and give the rest of the test process the collector it had."""
    thresholds = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("unfrozen_gc")
async def test_once_started_the_heap_is_frozen_and_the_collector_tuned() -> None:
    log: list[str] = []
    runner = ServiceRunner(LifecycleSettings(), signals=())
    task = asyncio.create_task(
        runner.run(["a"], start_channel=starter(log), dispatcher=RecordingDispatcher(log))
    )
    while "start a" not in log:
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert gc.get_freeze_count() > 0  # start-up's objects: see bot.lifecycle.settle_heap
    assert gc.get_threshold() == GC_THRESHOLDS
    runner.request_stop()
    assert await task == EXIT_OK


async def test_a_failing_channel_stops_the_service_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    runner = ServiceRunner(LifecycleSettings(on_channel_failure="stop"), signals=())
    code = await runner.run(
        ["a", "b", "c"],
        start_channel=starter(log, {"b": ChannelError("telegram rejected the token")}),
        dispatcher=RecordingDispatcher(log),
    )
    assert code == EXIT_CHANNEL_FAILED
    assert log == ["recover", "start a", "start b", "stop a"]  # c never started, a stopped again
    assert runner.channel_health()["b"].state == "failed"
    assert runner.channel_health()["b"].error == "telegram rejected the token"


async def test_a_failing_channel_runs_degraded_when_allowed() -> None:
    log: list[str] = []
    runner = ServiceRunner(LifecycleSettings(on_channel_failure="degraded"), signals=())
    task = asyncio.create_task(
        runner.run(
            ["a", "b"],
            start_channel=starter(log, {"a": RuntimeError("library exploded")}),
            dispatcher=RecordingDispatcher(log),
        )
    )
    while "start b" not in log:
        await asyncio.sleep(0)
    health = runner.channel_health()
    assert (health["a"].state, health["a"].error, health["b"].state) == (
        "failed",
        "library exploded",
        "running",
    )
    runner.request_stop()
    assert await task == EXIT_OK
    assert log[-1] == "stop b"


@pytest.mark.parametrize(("policy", "failing", "stops"), [("stop", "a", True), ("degraded", "a", False)])
async def test_a_channel_that_fails_while_serving_is_judged_like_one_that_failed_to_start(
    policy: str, failing: str, stops: bool
) -> None:
    """A token revoked while running left a process that served nothing and later exited 0."""
    log: list[str] = []
    channels: dict[str, Channel] = {}
    start = starter(log)

    async def remember(name: str) -> Channel:
        channels[name] = await start(name)
        return channels[name]

    runner = ServiceRunner(LifecycleSettings(on_channel_failure=policy), signals=(), watch_every=0.01)  # type: ignore[arg-type]
    task = asyncio.create_task(
        runner.run(["a", "b"], start_channel=remember, dispatcher=RecordingDispatcher(log))
    )
    while "start b" not in log:
        await asyncio.sleep(0)
    channels[failing].health.state = "failed"  # as a channel marks itself when its platform refuses it
    await asyncio.sleep(0.1)
    if stops:
        assert await task == EXIT_CHANNEL_FAILED
    else:
        assert not task.done()  # one channel is still up: degraded
        channels["b"].health.state = "failed"  # now none is
        assert await task == EXIT_CHANNEL_FAILED


async def test_with_no_channel_up_it_always_stops() -> None:
    log: list[str] = []
    runner = ServiceRunner(LifecycleSettings(on_channel_failure="degraded"), signals=())
    code = await runner.run(
        ["a"], start_channel=starter(log, {"a": ChannelError("no")}), dispatcher=RecordingDispatcher(log)
    )
    assert code == EXIT_CHANNEL_FAILED


async def test_first_signal_drains_second_exits_at_once() -> None:
    log: list[str] = []
    exits: list[int] = []
    runner = ServiceRunner(LifecycleSettings(), hard_exit=exits.append, signals=(signal.SIGUSR1,))
    dispatcher = RecordingDispatcher(log)
    dispatcher.release.clear()  # a turn that will not finish by itself
    task = asyncio.create_task(runner.run(["a"], start_channel=starter(log), dispatcher=dispatcher))
    while "start a" not in log:
        await asyncio.sleep(0)
    os.kill(os.getpid(), signal.SIGUSR1)
    await dispatcher.closing.wait()
    assert exits == []
    os.kill(os.getpid(), signal.SIGUSR1)
    while not exits:
        await asyncio.sleep(0.01)
    assert exits == [128 + signal.SIGUSR1]
    dispatcher.release.set()  # the recorder did not really exit; let the run end
    assert await task == EXIT_OK


# ---- a real `membot run` subprocess -----------------------------------------------------------------


async def test_sigterm_mid_turn_lets_the_turn_finish_and_exits_cleanly(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="a considered answer", delay=3))  # long enough to scrape mid-turn
        async with membot_run(workspace, llm, admin=True) as service:
            await service.say("please think about this")
            await wait_in_flight(llm)
            async with httpx.AsyncClient() as http:
                health = await http.get(f"http://127.0.0.1:{service.admin_port}/healthz")
                metrics = await http.get(f"http://127.0.0.1:{service.admin_port}/metrics")
            assert health.status_code == 200 and health.json()["channels"]["cli"]["state"] == "running"
            assert "membot_running_turns 1.0" in metrics.text
            service.process.send_signal(signal.SIGTERM)
            code, out = await service.finish()
    assert code == 0, service.stderr
    assert "a considered answer" in out  # the reply still went out during the grace period
    for event in ("membot_stopping", "membot_stopped"):
        assert event in service.stderr
    messages = await asyncio.to_thread(stored, workspace)
    assert messages == [("user", "please think about this"), ("assistant", "a considered answer")]
    assert await Inbox(workspace / "inbox").load_pending() == [], "the inbox still holds the answered message"


async def test_a_hangup_drains_like_sigterm(tmp_path: Path) -> None:
    """SIGHUP (an ssh or tmux session hanging up) killed the process mid-turn with no drain."""
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="answered before the hangup ended it", delay=1))
        async with membot_run(workspace, llm) as service:
            await service.say("a question")
            await wait_in_flight(llm)
            service.process.send_signal(signal.SIGHUP)
            code, out = await service.finish()
    assert code == 0, service.stderr
    assert "answered before the hangup ended it" in out and "membot_stopped" in service.stderr


async def test_a_turn_over_the_grace_period_is_cancelled_and_the_message_kept(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="too late", delay=5))
        async with membot_run(workspace, llm, MEMBOT_LIFECYCLE__GRACE_PERIOD="0.2") as service:
            await service.say("a slow question")
            await wait_in_flight(llm)
            service.process.send_signal(signal.SIGTERM)
            code, _ = await service.finish()
    assert code == 0, service.stderr
    assert await asyncio.to_thread(stored, workspace) == [("user", "a slow question")]


async def test_a_second_signal_exits_at_once_without_corrupting_files(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="never seen", delay=5))
        async with membot_run(workspace, llm, MEMBOT_LIFECYCLE__GRACE_PERIOD="60") as service:
            await service.say("hold on")
            await wait_in_flight(llm)
            service.process.send_signal(signal.SIGTERM)
            await service.wait_log("membot_stopping")
            service.process.send_signal(signal.SIGTERM)
            code, _ = await service.finish(timeout=10)
    assert code == 128 + signal.SIGTERM
    assert "exiting now" in service.stderr
    pending = await Inbox(workspace / "inbox").load_pending()
    assert [e.message.text for e in pending] == ["hold on"]  # answered after the next start
    session_headers_parse(workspace)


async def test_sigterm_mid_turn_on_telegram_with_the_terminal_off(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(text="answer from the grace period", delay=1.5))
        telegram = {
            "MEMBOT_TERMINAL__ENABLED": "false",
            "MEMBOT_TELEGRAM__TOKEN": tg.token,
            "MEMBOT_TELEGRAM__BASE_URL": tg.base_url,
            "MEMBOT_TELEGRAM__BASE_FILE_URL": tg.base_file_url,
            "MEMBOT_TELEGRAM__ALLOWED_USERS": '["42"]',
        }
        async with membot_run(workspace, llm, admin=True, **telegram) as service:
            tg.push_message("are you there?", chat_id=777, user_id=42)
            await wait_in_flight(llm)
            async with httpx.AsyncClient() as http:
                health = await http.get(f"http://127.0.0.1:{service.admin_port}/healthz")
            assert health.status_code == 200 and list(health.json()["channels"]) == ["telegram"]
            service.process.send_signal(signal.SIGTERM)
            code, _ = await service.finish()
        assert code == 0, service.stderr
        assert any("answer from the grace period" in sent.text for sent in tg.sent_to(777))
    messages = await asyncio.to_thread(stored, workspace, "telegram:777")
    assert messages == [("user", "are you there?"), ("assistant", "answer from the grace period")]
