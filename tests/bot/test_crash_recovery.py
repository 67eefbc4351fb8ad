"""The durable path of a message, proven on the real ``membot run`` process with protocol fakes.

A message Telegram handed over is answered exactly once whatever happens to the process: killed in
the middle of a turn, killed with the answer saved but not yet sent, stopped past its grace period,
stopped while new messages arrive, or restarted while another channel cannot start.
"""

from __future__ import annotations

import asyncio
import resource
import signal
from pathlib import Path

from bot.model_wait import NOTICE
from tests.bot.membot_service import membot_run, stored, telegram_env, wait_in_flight
from tests.channels.telegram.kit import break_folder
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.fakes.telegram_server import FakeTelegramServer


def answers(tg: FakeTelegramServer, chat: int, text: str) -> list[str]:
    return [m.text for m in tg.sent_to(chat) if text in m.text]


async def wait_answer(tg: FakeTelegramServer, chat: int, text: str, timeout: float = 30) -> None:
    await tg.wait_for(lambda: bool(answers(tg, chat, text)), timeout=timeout)


async def stop(service: object) -> None:
    process = service.process  # type: ignore[attr-defined]
    process.send_signal(signal.SIGTERM)
    code, _ = await service.finish()  # type: ignore[attr-defined]
    assert code == 0, service.stderr  # type: ignore[attr-defined]


async def test_a_turn_killed_mid_answer_is_answered_once_after_restart(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(text="never finished", delay=60))
        async with membot_run(workspace, llm, **telegram_env(tg)) as service:
            tg.push_message("what is the capital of France?", chat_id=777, user_id=42)
            await wait_in_flight(llm)
            await service.kill()
        llm.script(FakeReply(text="Paris."))
        async with membot_run(workspace, llm, **telegram_env(tg)) as service:
            await wait_answer(tg, 777, "Paris.")
            await stop(service)
        assert [m.text for m in tg.sent_to(777)] == ["Paris."]
    assert await asyncio.to_thread(stored, workspace, "telegram:777") == [
        ("user", "what is the capital of France?"),
        ("assistant", "Paris."),
    ]


async def test_a_turn_cut_by_the_grace_period_is_answered_after_restart(tmp_path: Path) -> None:
    """The stopped turn saved the question; the next start answers it without adding it again."""
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(text="too late", delay=60))
        env = telegram_env(tg, MEMBOT_LIFECYCLE__GRACE_PERIOD="0.2")
        async with membot_run(workspace, llm, **env) as service:
            tg.push_message("a slow question", chat_id=777, user_id=42)
            await wait_in_flight(llm)
            await stop(service)
        assert await asyncio.to_thread(stored, workspace, "telegram:777") == [("user", "a slow question")]
        llm.script(FakeReply(text="the considered answer"))
        async with membot_run(workspace, llm, **env) as service:
            await wait_answer(tg, 777, "the considered answer")
            await stop(service)
        assert [m.text for m in tg.sent_to(777)] == ["the considered answer"]
        assert llm.requests[-1].body["messages"][-1]["content"] == "a slow question"
    assert await asyncio.to_thread(stored, workspace, "telegram:777") == [
        ("user", "a slow question"),
        ("assistant", "the considered answer"),
    ]


async def test_a_question_waiting_for_the_model_is_answered_once_after_a_kill_and_restart(
    tmp_path: Path,
) -> None:
    """The model is down (503 past the client's retries): the chat is told once and the question waits,
    unanswered; killed meanwhile, the next start answers it once the model is back."""
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        down = True
        llm.responder = lambda api, body: FakeReply(status=503) if down else None
        env = telegram_env(tg, MEMBOT_LLM__MAX_RETRIES="0", MEMBOT_DISPATCHER__MODEL_RETRY_FIRST="60")
        async with membot_run(workspace, llm, **env) as service:
            tg.push_message("is anyone there?", chat_id=777, user_id=42)
            await wait_answer(tg, 777, NOTICE)
            await service.wait_log("turn_waiting_for_model")
            await service.kill()
        down = False
        async with membot_run(workspace, llm, **env) as service:
            await wait_answer(tg, 777, "echo: is anyone there?")
            await stop(service)
        assert [m.text for m in tg.sent_to(777)] == [NOTICE, "echo: is anyone there?"]
    assert await asyncio.to_thread(stored, workspace, "telegram:777") == [
        ("user", "is anyone there?"),
        ("assistant", "echo: is anyone there?"),
    ]


async def test_a_new_waiting_for_a_turn_when_killed_runs_once_after_restart(tmp_path: Path) -> None:
    """The chat was told the /new "runs as soon as the current reply is done": a kill before then must
    not lose it. The next start answers the question, then starts the fresh conversation."""
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(text="never finished", delay=60))
        async with membot_run(workspace, llm, **telegram_env(tg)) as service:
            tg.push_message("a slow question", chat_id=777, user_id=42)
            await wait_in_flight(llm)
            tg.push_message("/new", chat_id=777, user_id=42)
            await wait_answer(tg, 777, "⏳ /new runs as soon as the current reply is done")
            await service.kill()
        async with membot_run(workspace, llm, **telegram_env(tg)) as service:
            await wait_answer(tg, 777, "Session cleared.")
            tg.push_message("a fresh start", chat_id=777, user_id=42)
            await wait_answer(tg, 777, "echo: a fresh start")
            await stop(service)
        assert [m.text for m in tg.sent_to(777)][1:] == [
            "echo: a slow question",
            "Session cleared.",
            "echo: a fresh start",
        ]
    assert await asyncio.to_thread(stored, workspace, "telegram:777") == [
        ("user", "a fresh start"),
        ("assistant", "echo: a fresh start"),
    ]


async def test_an_answer_saved_but_not_sent_is_delivered_once_after_restart(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        tg.fail("sendMessage", 502, "Bad Gateway", times=1000)  # Telegram down: the channel retries
        async with membot_run(workspace, llm, **telegram_env(tg)) as service:
            tg.push_message("remember the milk", chat_id=777, user_id=42)
            await tg.wait_for(lambda: bool(tg.calls_to("sendMessage")), timeout=30)
            await service.kill()  # the answer is saved; its send never succeeded
        tg.failures.clear()
        requests = len(llm.requests)
        async with membot_run(workspace, llm, **telegram_env(tg)) as service:
            await wait_answer(tg, 777, "echo: remember the milk")
            await stop(service)
        assert [m.text for m in tg.sent_to(777)] == ["echo: remember the milk"]
        assert not [
            r for r in llm.requests[requests:] if r.body["messages"][-1]["content"] == "remember the milk"
        ]
    assert await asyncio.to_thread(stored, workspace, "telegram:777") == [
        ("user", "remember the milk"),
        ("assistant", "echo: remember the milk"),
    ]


async def test_an_answer_saved_but_not_sent_is_delivered_once_by_a_start_the_disk_refuses_its_copy(
    tmp_path: Path,
) -> None:
    """The start copies such an answer from the session log into the inbox before sending it; a copy
    the disk refused (here every write past the inbox file's size and a done mark, as a full disk
    refuses a long line) ended the start with a bare ``error: File too large`` (exit 1), which systemd
    restarted into the same failure. Now the answer goes out from the log, once, and the start goes on."""
    workspace = tmp_path / "ws"
    long = "the milk list: " + "milk " * 600  # (3 KB: its copy is one line past the limit)
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        env = telegram_env(tg, MEMBOT_MEMORY__EMBEDDINGS="none")
        tg.fail("sendMessage", 502, "Bad Gateway", times=1000)  # Telegram down: the channel retries
        llm.script(FakeReply(text=long))
        async with membot_run(workspace, llm, **env) as service:
            tg.push_message("remember the milk", chat_id=777, user_id=42)
            await tg.wait_for(lambda: bool(tg.calls_to("sendMessage")), timeout=30)
            await service.kill()  # the answer is saved in the session log; its send never succeeded
        tg.failures.clear()
        inbox = workspace / "inbox" / "telegram:777.jsonl"
        full = inbox.stat().st_size + 1024  # room for done marks, none for the answer's copy
        async with membot_run(workspace, llm, max_file_bytes=full, **env) as service:
            await wait_answer(tg, 777, "the milk list")
            async with asyncio.timeout(30):  # its entry done (the file is cut once nothing is pending)
                while inbox.stat().st_size and '"done"' not in inbox.read_text():
                    await asyncio.sleep(0.02)
            await stop(service)
        assert '"event": "kept_reply_copy_failed"' in service.stderr, service.stderr
        assert [m.text for m in tg.sent_to(777)] == [long.strip()]
        assert len(llm.requests) == 1  # the saved answer, not a second one


async def test_pending_messages_are_answered_while_another_channel_still_starts(tmp_path: Path) -> None:
    """Discord unreachable (its start waits for its timeout): Telegram's pending and new messages are
    answered meanwhile, and the new one does not push the pending one out of the inbox."""
    workspace = tmp_path / "ws"

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # hold the connection open until the client gives up
        writer.close()

    black_hole = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = black_hole.sockets[0].getsockname()[1]
    async with black_hole, FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(text="never finished", delay=60))
        async with membot_run(workspace, llm, **telegram_env(tg)) as service:
            tg.push_message("the pending question", chat_id=777, user_id=42)
            await wait_in_flight(llm)
            await service.kill()
        discord = {
            "MEMBOT_DISCORD__TOKEN": "fake.discord.token",
            "MEMBOT_DISCORD__API_BASE": f"http://127.0.0.1:{port}/api/v10",
            "MEMBOT_DISCORD__GATEWAY_URL": f"ws://127.0.0.1:{port}/",
            "MEMBOT_DISCORD__START_TIMEOUT": "120",
        }
        env = telegram_env(tg, **discord)
        async with membot_run(workspace, llm, ready="telegram_started", **env) as service:
            tg.push_message("a new question", chat_id=777, user_id=42)
            await wait_answer(tg, 777, "echo: the pending question")
            await wait_answer(tg, 777, "echo: a new question")
            assert not service.logged("membot_started")  # Discord is still starting
            await service.kill()
        assert len(tg.sent_to(777)) == 2
    messages = await asyncio.to_thread(stored, workspace, "telegram:777")
    assert sorted(text for role, text in messages if role == "user") == [
        "a new question",
        "the pending question",
    ]


async def test_a_message_arriving_during_shutdown_is_kept_and_answered_after_restart(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(text="the slow answer", delay=8))
        env = telegram_env(tg, MEMBOT_LIFECYCLE__GRACE_PERIOD="60")
        async with membot_run(workspace, llm, **env) as service:
            tg.push_message("a slow question", chat_id=777, user_id=42)
            await wait_in_flight(llm)
            service.process.send_signal(signal.SIGTERM)
            await service.wait_log("membot_stopping")
            tg.push_message("sent during the shutdown", chat_id=778, user_id=42)
            await tg.wait_for(lambda: bool(tg.sent_to(778)), timeout=30)  # told we are restarting
            code, _ = await service.finish()
        assert code == 0, service.stderr
        assert answers(tg, 777, "the slow answer")
        assert not answers(tg, 778, "echo:")
        async with membot_run(workspace, llm, **env) as service:
            await wait_answer(tg, 778, "echo: sent during the shutdown")
            await stop(service)
        assert len(answers(tg, 778, "echo: sent during the shutdown")) == 1
    assert await asyncio.to_thread(stored, workspace, "telegram:778") == [
        ("user", "sent during the shutdown"),
        ("assistant", "echo: sent during the shutdown"),
    ]


async def test_a_long_answer_killed_between_its_chunks_sends_only_the_rest_after_restart(
    tmp_path: Path,
) -> None:
    """An answer too long for one Telegram message goes out in chunks, about one a second. Killed after
    the first went out, the next start sends the rest: the chat never gets the first chunk twice."""
    workspace = tmp_path / "ws"
    parts = [f"PART-{n} " + "word " * 700 for n in (1, 2, 3)]  # ~3500 characters each: one chunk each
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(text="\n\n".join(parts)))
        # Telegram takes the first chunk, then is down for the second (the channel retries it).
        tg.fail("sendMessage", 502, "Bad Gateway", times=1000, when=lambda p: "PART-2" in str(p.get("text")))
        async with membot_run(workspace, llm, **telegram_env(tg)) as service:
            tg.push_message("tell me a long story", chat_id=777, user_id=42)
            await tg.wait_for(
                lambda: any("PART-2" in str(c.params.get("text")) for c in tg.calls), timeout=30
            )
            await service.kill()
        assert [m.text.split()[0] for m in tg.sent_to(777)] == ["PART-1"]
        tg.failures.clear()
        async with membot_run(workspace, llm, **telegram_env(tg)) as service:
            await wait_answer(tg, 777, "PART-3")
            await stop(service)
        assert [m.text.split()[0] for m in tg.sent_to(777)] == ["PART-1", "PART-2", "PART-3"]


async def test_a_turn_killed_after_its_tool_ran_does_not_run_it_again_after_restart(tmp_path: Path) -> None:
    """Answered again from the start after the restart, the turn asks for the same tool call: it gets the
    result the first run recorded, and the note is appended once, not twice."""
    workspace = tmp_path / "ws"
    append = ("files", {"action": "append", "path": "notes/shopping.md", "content": "- milk"})
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(tool_calls=[append]), FakeReply(text="never finished", delay=60))
        async with membot_run(workspace, llm, **telegram_env(tg)) as service:
            tg.push_message("add milk to my shopping list", chat_id=777, user_id=42)
            async with asyncio.timeout(30):
                while len(llm.requests) < 2 or not llm.in_flight:  # the tool ran; the model answers
                    await asyncio.sleep(0.01)
            await service.kill()
        llm.script(FakeReply(tool_calls=[append]), FakeReply(text="Added."))
        async with membot_run(workspace, llm, **telegram_env(tg)) as service:
            await wait_answer(tg, 777, "Added.")
            await stop(service)
        assert [m.text for m in tg.sent_to(777)] == ["Added."]
        tool_results = [m for m in llm.requests[-1].body["messages"] if m["role"] == "tool"]
    assert (workspace / "notes" / "shopping.md").read_text() == "- milk"  # (twice: "- milk- milk")
    assert len(tool_results) == 1 and "notes/shopping.md" in tool_results[0]["content"]


async def test_a_stop_while_the_disk_refuses_the_save_ends_cleanly_and_the_next_start_answers(
    tmp_path: Path,
) -> None:
    """A graceful stop on a full disk: the turn it cuts cannot be saved, nor can the session at close.
    That close failed the whole shutdown (exit 2, "error: cannot save session …"); the inbox still holds
    the question, so the next start answers it, once."""
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        llm.script(FakeReply(text="never saved", delay=60))
        env = telegram_env(tg, MEMBOT_LIFECYCLE__GRACE_PERIOD="0.2")
        async with membot_run(workspace, llm, **env) as service:
            tg.push_message("what is the capital of France?", chat_id=777, user_id=42)
            await wait_in_flight(llm)
            repair = break_folder(workspace / "sessions")  # no session can be saved now
            await stop(service)  # exit code 0
            assert service.logged("session_not_saved_at_stop") and service.logged("membot_stopped")
        repair()
        llm.script(FakeReply(text="Paris."))
        async with membot_run(workspace, llm, **telegram_env(tg)) as service:
            await wait_answer(tg, 777, "Paris.")
            await stop(service)
        assert [m.text for m in tg.sent_to(777)][-1] == "Paris."
        assert len(answers(tg, 777, "Paris.")) == 1
    assert await asyncio.to_thread(stored, workspace, "telegram:777") == [
        ("user", "what is the capital of France?"),
        ("assistant", "Paris."),
    ]


async def test_a_stop_right_after_the_disk_frees_up_writes_the_done_mark_it_waited_for(
    tmp_path: Path,
) -> None:
    """An answer went out while the disk refused its done mark (here every write past the inbox file's
    size, the process's RLIMIT_FSIZE, as a full disk refuses it). The operator frees space and restarts
    the bot: the done mark waited out its retry pause (2 s, growing to a minute) past the grace period,
    was never written, and the next start sent the answer a second time. Now a shutdown ends the pause
    and the mark is tried once more at once: the answer went out once."""
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        env = telegram_env(
            tg,
            MEMBOT_MEMORY__EMBEDDINGS="none",
            MEMBOT_LIFECYCLE__GRACE_PERIOD="1",
            MEMBOT_TELEGRAM__POLL_TIMEOUT="1",
        )
        tg.slow["sendMessage"] = 1.0  # taken at once, answered late: time to fill the disk meanwhile
        async with membot_run(workspace, llm, **env) as service:
            tg.push_message("remember the milk", chat_id=777, user_id=42)
            await wait_answer(tg, 777, "echo: remember the milk")
            inbox = workspace / "inbox" / "telegram:777.jsonl"
            full = inbox.stat().st_size  # the chat's inbox file cannot grow: its done mark is refused
            resource.prlimit(service.process.pid, resource.RLIMIT_FSIZE, (full, resource.RLIM_INFINITY))
            await service.wait_log("storage_write_failed_retrying")
            unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            resource.prlimit(service.process.pid, resource.RLIMIT_FSIZE, unlimited)  # space freed
            await stop(service)  # and the bot restarted, within the retry's pause
        async with membot_run(workspace, llm, **env) as service:
            await stop(service)
        assert [m.text for m in tg.sent_to(777)] == ["echo: remember the milk"], service.stderr
