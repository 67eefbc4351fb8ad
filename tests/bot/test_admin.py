"""/healthz and /metrics over real HTTP, after a real turn through the pipeline and the fake LLM."""

from __future__ import annotations

import asyncio
import io
import json
import re
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from bot.admin import AdminServer, health_report
from bot.app import build_core
from bot.config import AdminSettings, Settings, load_settings
from bot.domain import InboundMessage
from bot.errors import InUseError, LLMRateLimited, LLMTimeout
from bot.llm.client import LLMStats
from bot.logging import SecretRedactor
from bot.metrics import Metrics
from channels.base import ChannelHealth, PartialSink
from channels.terminal import TerminalChannel
from tests.bot.membot_service import membot_run, telegram_env
from tests.channels.telegram.kit import break_folder
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.telegram_server import FakeTelegramServer
from tests.recording import RecordingChannel


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text, or None when it is absent."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # the text format sorts labels
    pattern = rf"^{re.escape(name)}{re.escape('{' + wanted + '}') if wanted else ''} (\S+)$"
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else None


class Screen(io.StringIO):
    async def wait_for(self, text: str) -> None:
        async with asyncio.timeout(10):
            while text not in self.getvalue():
                await asyncio.sleep(0.01)


async def settings_for(workspace: Path, llm: FakeLLMServer) -> Settings:
    """The bot's settings on ``workspace`` with the fake model server as its model."""
    overrides = {
        "workspace": workspace,
        "llm": {"openai": {"base_url": llm.openai_base_url, "api_key": "sk-test-key-123456"}},
    }
    return await asyncio.to_thread(load_settings, None, env_file=None, overrides=overrides)


async def test_healthz_and_metrics_after_a_real_turn(tmp_path: Path) -> None:
    async with FakeLLMServer() as llm:
        llm.script(FakeReply(text="hello there", usage=(120, 30)))
        settings = await settings_for(tmp_path / "ws", llm)
        metrics = Metrics()
        async with build_core(settings, metrics=metrics) as core:
            metrics.watch(
                llm_stats=lambda: core.llm.stats,
                queued=core.dispatcher.total_queued,
                running_turns=core.dispatcher.running_turns,
                active_sessions=lambda: core.sessions.cached,
            )
            reader, screen = asyncio.StreamReader(), Screen()
            channel = TerminalChannel(core.dispatcher.submit, user="ops", reader=reader, writer=screen)
            core.dispatcher.attach(channel)
            admin = AdminServer(
                AdminSettings(enabled=True, port=0),
                metrics,
                channels=lambda: {"cli": channel.health},
                llm_stats=lambda: core.llm.stats,
            )
            async with admin, httpx.AsyncClient(base_url=f"http://127.0.0.1:{admin.port}") as http:
                before = await http.get("/healthz")
                assert before.status_code == 503  # the channel is not running yet
                assert before.json()["channels"]["cli"]["state"] == "stopped"

                await channel.start()
                reader.feed_data(b"hi\n")
                await screen.wait_for("hello there")
                async with asyncio.timeout(10):  # the text streams before the turn has finished
                    while core.dispatcher.running_turns() or not core.dispatcher.turns_completed:
                        await asyncio.sleep(0.01)

                health = await http.get("/healthz")
                page = await http.get("/metrics")
            await channel.stop()

    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "ok"
    assert datetime.fromisoformat(body["channels"]["cli"]["last_inbound"])
    assert body["channels"]["cli"]["sent"] == 1
    assert body["llm"]["reachable"] is True and body["llm"]["calls"] == 1

    assert page.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = page.text
    assert sample(text, "membot_turns_total", channel="cli", outcome="ok") == 1
    assert sample(text, "membot_turn_duration_seconds_count", channel="cli") == 1
    assert sample(text, "membot_llm_calls_total", model="gpt-4.1-mini") == 1
    assert sample(text, "membot_llm_tokens_total", model="gpt-4.1-mini", kind="input") == 120
    assert sample(text, "membot_llm_tokens_total", model="gpt-4.1-mini", kind="output") == 30
    assert (sample(text, "membot_llm_cost_usd_total", model="gpt-4.1-mini") or 0) > 0
    assert sample(text, "membot_llm_failures_total") == 0
    assert sample(text, "membot_llm_last_call_ok") == 1
    assert sample(text, "membot_queue_depth") == 0
    assert sample(text, "membot_running_turns") == 0
    assert sample(text, "membot_active_sessions") == 1


async def test_tool_names_no_tool_has_are_one_series_of_metrics(tmp_path: Path) -> None:
    """The model names the tools it calls, and a page it read can choose the names: each made-up one
    was a series of its own on /metrics, kept for the life of the process (unbounded, as long as the
    model cared to write them)."""
    made_up = [f"ignore_previous_{i}_" + "x" * 2000 for i in range(5)]
    async with FakeLLMServer() as llm:
        llm.script(
            FakeReply(tool_calls=[*((name, {}) for name in made_up), ("time", {})]),
            FakeReply(text="no such tools"),
        )
        settings = await settings_for(tmp_path / "ws", llm)
        metrics = Metrics()
        async with build_core(settings, metrics=metrics) as core:
            reader, screen = asyncio.StreamReader(), Screen()
            channel = TerminalChannel(core.dispatcher.submit, user="ops", reader=reader, writer=screen)
            core.dispatcher.attach(channel)
            await channel.start()
            reader.feed_data(b"what time is it?\n")
            await screen.wait_for("no such tools")
            await channel.stop()
    text = metrics.render().decode()
    assert sample(text, "membot_tool_calls_total", tool="(unknown)", outcome="unknown") == 5
    assert sample(text, "membot_tool_calls_total", tool="time", outcome="ok") == 1
    assert "ignore_previous" not in text


def test_recording_calls_show_up_and_registries_are_separate() -> None:
    one, two = Metrics(), Metrics()
    one.tool_call("web_fetch", "timeout")
    one.tool_call("web_fetch", "timeout")
    one.compaction(fallback=True)
    one.consolidation(fallback=False)
    one.turn_finished("telegram", "error", 2.0)
    stats = LLMStats(retries=3, failovers=1, last_ok=False)
    stats.failed("gpt-a", LLMTimeout("slow"))
    stats.failed("gpt-a", LLMTimeout("slow"))
    stats.failed("gpt-a", LLMRateLimited("429"))
    stats.failed("claude-b", RuntimeError("odd"))
    one.watch(llm_stats=lambda: stats)
    text = one.render().decode()
    assert sample(text, "membot_tool_calls_total", tool="web_fetch", outcome="timeout") == 2
    assert sample(text, "membot_compactions_total", result="fallback") == 1
    assert sample(text, "membot_consolidations_total", result="ok") == 1
    assert sample(text, "membot_turns_total", channel="telegram", outcome="error") == 1
    assert sample(text, "membot_llm_retries_total") == 3
    assert sample(text, "membot_llm_failovers_total") == 1
    assert sample(text, "membot_llm_failures_total") == 4
    assert sample(text, "membot_llm_model_failures_total", model="gpt-a", reason="timeout") == 2
    assert sample(text, "membot_llm_model_failures_total", model="gpt-a", reason="rate_limited") == 1
    assert sample(text, "membot_llm_model_failures_total", model="claude-b", reason="error") == 1
    assert sample(text, "membot_llm_last_call_ok") == 0
    other = two.render().decode()
    assert sample(other, "membot_tool_calls_total", tool="web_fetch", outcome="timeout") is None
    assert sample(other, "membot_llm_retries_total") is None  # no source watched: nothing exported


def test_health_is_503_when_any_channel_is_not_running() -> None:
    running = ChannelHealth(state="running")
    for state in ("failed", "degraded", "starting", "stopped"):
        code, body = health_report(
            {"telegram": running, "discord": ChannelHealth(state=state)},  # type: ignore[arg-type]
            None,
            uptime=1,
        )
        assert (code, body["status"]) == (503, "unhealthy")
    code, body = health_report({"telegram": running}, LLMStats(last_ok=False, last_error="boom"), uptime=1)
    assert code == 200  # the LLM's state is reported, but a restart would not fix a provider outage
    assert body["llm"] == {
        "reachable": False,
        "last_call_at": None,
        "last_error": "boom",
        "calls": 0,
        "failures": 0,
        "skipped_models": {},
    }
    assert health_report({}, None, uptime=1)[0] == 503
    # A key the operator put in a base URL's query string is not shown to whoever may ask /healthz.
    leaky = LLMStats(last_error="ConnectError: http://llm.local/v1?api_key=hunter2secret failed")
    assert "hunter2secret" not in json.dumps(health_report({}, leaky, uptime=1)[1])


async def test_a_taken_port_is_in_use_naming_the_setting() -> None:
    """In use, not a ConfigError: the port may be free in a moment (the old membot still stopping), so
    ``membot run`` exits 75, which systemd restarts, not 78."""
    metrics = Metrics()
    async with AdminServer(AdminSettings(port=0), metrics, channels=dict, llm_stats=lambda: None) as first:
        taken = AdminSettings(port=first.port)
        with pytest.raises(InUseError, match="MEMBOT_ADMIN__PORT"):
            async with AdminServer(taken, metrics, channels=dict, llm_stats=lambda: None):
                pass


def test_healthz_shows_no_secret_of_the_configuration_in_any_error() -> None:
    """Channel errors too (a Bot API front that echoes the request path puts the token in one), with
    the log's redaction: the configured secrets, whatever their shape, and credential shapes."""
    token, key = "123456789:AAFakeTokenForTestsOnly_abcdefghijklmno", "local-llm-pass-7781"
    telegram = ChannelHealth(state="degraded", error=f"Bad Gateway: upstream failed for POST /bot{token}/x")
    llm = LLMStats(last_ok=False, last_error=f"LLMUnavailable: {key} refused by the proxy")
    redact = SecretRedactor([token, key]).redact

    served = json.dumps(health_report({"telegram": telegram}, llm, uptime=1, redact=redact)[1])
    by_shape = json.dumps(health_report({"telegram": telegram}, None, uptime=1)[1])  # the default

    assert token.split(":")[1] not in served and key not in served and "upstream failed" in served
    assert token.split(":")[1] not in by_shape


async def test_healthz_tells_of_a_storage_outage_while_it_lasts(tmp_path: Path) -> None:
    """/healthz answered 200 "ok" while a full disk kept every message out, or held a chat at its save;
    two chats held at their saves showed as one entry ("session_save"), not one each."""
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm:
        overrides = {
            "workspace": workspace,
            "llm": {"openai": {"base_url": llm.openai_base_url, "api_key": "sk-test-key-123456"}},
        }
        settings = await asyncio.to_thread(load_settings, None, env_file=None, overrides=overrides)
        async with build_core(settings) as core:
            reader, screen = asyncio.StreamReader(), Screen()
            channel = TerminalChannel(core.dispatcher.submit, user="ops", reader=reader, writer=screen)
            core.dispatcher.attach(channel)
            admin = AdminServer(
                AdminSettings(enabled=True, port=0),
                Metrics(),
                channels=lambda: {"cli": channel.health},
                llm_stats=lambda: core.llm.stats,
                storage=core.dispatcher.storage_waits,
            )
            async with admin, httpx.AsyncClient(base_url=f"http://127.0.0.1:{admin.port}") as http:
                await channel.start()
                repair = break_folder(workspace / "inbox")  # the message cannot be taken in
                reader.feed_data(b"kept out\n")
                await screen.wait_for("I can't save your message right now")
                kept_out = await http.get("/healthz")
                repair()
                await screen.wait_for("echo: kept out")
                taken = await http.get("/healthz")

                await core.dispatcher.submit(InboundMessage("cli", "dev", "dev", "hi", message_id="dev-1"))
                await screen.wait_for("echo: hi")  # a second chat, its session saved once
                repair = break_folder(workspace / "sessions")  # taken in, but its answer cannot be saved
                reader.feed_data(b"held at its save\n")
                await core.dispatcher.submit(
                    InboundMessage("cli", "dev", "dev", "held too", message_id="dev-2")
                )
                async with asyncio.timeout(10):
                    while not all(map(core.dispatcher.storage_wait, ("cli:ops", "cli:dev"))):
                        await asyncio.sleep(0.01)
                held = await http.get("/healthz")
                repair()
                await screen.wait_for("echo: held at its save")
                await screen.wait_for("echo: held too")
                async with asyncio.timeout(10):  # the text shows before the turn's done mark is written
                    while core.dispatcher.running_turns():
                        await asyncio.sleep(0.01)
                saved = await http.get("/healthz")
            await channel.stop()

    assert kept_out.status_code == 503 and kept_out.json()["status"] == "unhealthy"
    [(what, error)] = kept_out.json()["storage"]["failing"].items()
    assert what == "cli: taking terminal messages in" and error.startswith("NotADirectoryError")
    assert held.status_code == 503
    assert list(held.json()["storage"]["failing"]) == ["session_save (cli:dev)", "session_save (cli:ops)"]
    for recovered in (taken, saved):
        assert recovered.status_code == 200 and recovered.json()["storage"] == {"ok": True, "failing": {}}


async def test_healthz_of_membot_run_answers_503_while_a_full_disk_keeps_messages_out(tmp_path: Path) -> None:
    """The real ``membot run`` with Telegram: while no update can be stored, /healthz says why (it said
    "ok"); once storage is back the message is answered and /healthz is 200 again."""
    workspace = tmp_path / "ws"
    async with (
        FakeLLMServer() as llm,
        FakeTelegramServer() as tg,
        membot_run(workspace, llm, admin=True, **telegram_env(tg)) as service,
    ):
        url = f"http://127.0.0.1:{service.admin_port}/healthz"
        tg.push_message("first", chat_id=777, user_id=42)
        await tg.wait_for_messages(1, timeout=30)
        repairs = [break_folder(workspace / "state"), break_folder(workspace / "inbox")]
        tg.push_message("written on a full disk", chat_id=777, user_id=42)
        await service.wait_log("storage_unavailable")
        async with httpx.AsyncClient() as http:
            during = await http.get(url)
            for repair in repairs:
                repair()
            await tg.wait_for_messages(2, timeout=30)
            async with asyncio.timeout(30):  # every write that waited goes through by itself
                while (after := await http.get(url)).status_code != 200:
                    await asyncio.sleep(0.05)
    assert during.status_code == 503
    failing = during.json()["storage"]["failing"]  # (the first answer's done mark may wait too)
    assert failing["telegram: the Telegram update journal"].startswith("NotADirectoryError")
    assert [m.text for m in tg.sent_to(777)] == ["echo: first", "echo: written on a full disk"]
    assert after.status_code == 200 and after.json()["storage"] == {"ok": True, "failing": {}}


class CrashingChannel(RecordingChannel):
    """A channel whose streaming preview cannot be set up: the turn crashes outside the pipeline."""

    def partial_sink(self, chat_id: str, reply_to: str | None = None) -> PartialSink | None:
        raise RuntimeError("preview broken")


async def test_a_turn_that_crashed_is_counted_as_an_error_not_ok(tmp_path: Path) -> None:
    """A turn that crashed outside the pipeline (``turn_crashed`` in the log; the chat is told it went
    wrong) was counted as ``outcome="ok"`` on /metrics: its outcome was decided before it crashed."""
    async with FakeLLMServer() as llm:
        settings = await settings_for(tmp_path / "ws", llm)
        metrics = Metrics()
        async with build_core(settings, metrics=metrics) as core:
            channel = CrashingChannel(core.dispatcher.submit)
            core.dispatcher.attach(channel)
            await core.dispatcher.submit(InboundMessage("test", "c1", "u1", "hello"))
            [told] = await channel.wait_for(1)
    text = metrics.render().decode()
    assert told.is_error and "Sorry, I couldn't answer this" in told.text
    assert sample(text, "membot_turns_total", channel="test", outcome="error") == 1
    assert sample(text, "membot_turns_total", channel="test", outcome="ok") is None
