"""A Discord answer a kill cut short is finished where it started, on the real ``membot run`` process.

With ``discord.streaming`` the answer is shown as it comes in one preview message. Killed (SIGKILL)
before the answer went out, the next start answers the message again (``bot/recovery.py``): the answer
goes into that preview, not below it, and of an answer in several parts only the parts not yet shown
go out.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from bot.session_names import encode_id
from tests.bot.membot_service import Service, membot_run, stored
from tests.channels.telegram.kit import break_folder
from tests.fakes.discord_server import FakeDiscord, FakeUser, Json, RecordedRequest
from tests.fakes.llm_server import FakeLLMServer, FakeReply

ANSWER = "The answer is forty-two, as it always was and always will be."


def discord_env(fake: FakeDiscord, alice: FakeUser) -> dict[str, str]:
    """Discord against the fake, streaming (terminal off, ``alice`` allowed, a request that failed not
    tried again by the channel: the dispatcher's later try of the answer is the one that counts)."""
    return {
        "MEMBOT_TERMINAL__ENABLED": "false",
        "MEMBOT_DISCORD__TOKEN": fake.token,
        "MEMBOT_DISCORD__API_BASE": fake.api_base,
        "MEMBOT_DISCORD__GATEWAY_URL": fake.gateway_url,
        "MEMBOT_DISCORD__ALLOWED_USERS": f'["{alice.id}"]',
        "MEMBOT_DISCORD__STREAMING": "true",
        "MEMBOT_DISCORD__STREAM_EDIT_INTERVAL": "0.2",
        "MEMBOT_DISCORD__SEND_RETRIES": "0",
    }


async def stop(service: Service) -> None:
    service.process.send_signal(signal.SIGTERM)
    code, _ = await service.finish()
    assert code == 0, service.stderr


def previews(fake: FakeDiscord, chat: str) -> list[str]:
    return [text for text in fake.bot_texts(chat) if text.endswith(" …")]


def posted(request: RecordedRequest, text: str) -> bool:
    """A request that tried to post a message holding ``text``."""
    return request.method == "POST" and text in str((request.body or {}).get("content"))


async def on_record(workspace: Path, preview: Json) -> None:
    """Until the bot wrote the preview down (``state/discord_sent.json``): a kill before that, in the one
    fsync between Discord's answer and the write, would leave a preview no start could know of."""
    path = workspace / "state" / "discord_sent.json"
    async with asyncio.timeout(30):
        while preview["id"] not in (path.read_text() if path.exists() else ""):
            await asyncio.sleep(0.02)


async def answered(workspace: Path, sid: str) -> None:
    """Until the inbox holds nothing of ``sid`` (its file is cut once all was answered)."""
    path = workspace / "inbox" / f"{encode_id(sid)}.jsonl"
    async with asyncio.timeout(30):
        while not path.exists() or path.stat().st_size:
            await asyncio.sleep(0.02)


def final(body: Json) -> bool:
    """A request that would put an answer on screen, not a preview of it."""
    content = body.get("content")
    return isinstance(content, str) and not content.endswith(" …")


async def test_a_streamed_answer_killed_midway_is_finished_in_its_preview_after_restart(
    tmp_path: Path,
) -> None:
    """The model stalls after the first words, shown in the preview; killed then, the next start asks the
    model again and streams the answer into that preview: the chat holds one message, the whole answer."""
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        alice, dm = fake.user("alice"), fake.dm_channel()
        env = discord_env(fake, alice)
        llm.script(FakeReply(text=ANSWER, stall_after=2, stall=60))  # the role, the first third, then silence
        async with membot_run(workspace, llm, **env) as service:
            await fake.user_message(channel_id=dm, author=alice, content="what is the answer?")
            await fake.wait_until(lambda: bool(previews(fake, dm)), timeout=30)
            [preview] = fake.bot_messages
            await on_record(workspace, preview)
            await service.kill()
        llm.script(FakeReply(text=ANSWER))
        async with membot_run(workspace, llm, **env) as service:
            await fake.wait_until(lambda: ANSWER in fake.bot_texts(dm), timeout=30)
            await stop(service)
        assert fake.bot_texts(dm) == [ANSWER]  # (was: the first words " …" above the answer)
        assert fake.bot_messages[0]["id"] == preview["id"]


async def test_an_answer_saved_but_not_shown_goes_into_its_preview_after_restart(tmp_path: Path) -> None:
    """The answer streamed in full, but Discord took neither its last edit nor the new message tried in
    its place; killed then, the next start sends the saved answer (the model is not asked again) into
    the preview the chat already shows."""
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        alice, dm = fake.user("alice"), fake.dm_channel()
        env = discord_env(fake, alice)
        llm.script(FakeReply(text=ANSWER))
        fake.fail("PATCH", f"/channels/{dm}/messages/", times=1000, when=final)
        fake.fail("POST", f"/channels/{dm}/messages", times=1000, when=final)
        async with membot_run(workspace, llm, **env) as service:
            await fake.user_message(channel_id=dm, author=alice, content="what is the answer?")
            await fake.wait_until(lambda: any(posted(r, ANSWER) for r in fake.requests), timeout=30)
            await service.kill()  # the answer is saved; the chat shows only its preview
        assert len(previews(fake, dm)) == 1 and len(fake.bot_messages) == 1
        fake.clear_faults()
        asked = len(llm.requests)
        async with membot_run(workspace, llm, **env) as service:
            await fake.wait_until(lambda: ANSWER in fake.bot_texts(dm), timeout=30)
            await stop(service)
        assert fake.bot_texts(dm) == [ANSWER]
        assert len(llm.requests) == asked  # sent again, not asked again


async def test_a_long_streamed_answer_killed_between_its_parts_sends_only_the_rest_after_restart(
    tmp_path: Path,
) -> None:
    """An answer in three messages: the first went into the preview, Discord failed the second; killed
    then, the next start sends the second and third only (the first, an edit, had no nonce to stop a
    second copy)."""
    workspace = tmp_path / "ws"
    parts = [f"PART-{n} " + "word " * 300 for n in (1, 2, 3)]  # ~1500 characters each: one message each
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        alice, dm = fake.user("alice"), fake.dm_channel()
        env = discord_env(fake, alice)
        llm.script(FakeReply(text="\n\n".join(parts)))
        fake.fail(
            "POST", f"/channels/{dm}/messages", times=1000, when=lambda b: "PART-2" in b.get("content", "")
        )
        async with membot_run(workspace, llm, **env) as service:
            await fake.user_message(channel_id=dm, author=alice, content="tell me a long story")
            await fake.wait_until(lambda: any(posted(r, "PART-2") for r in fake.requests), timeout=30)
            await service.kill()
        assert [text.split()[0] for text in fake.bot_texts(dm)] == ["PART-1"]
        fake.clear_faults()
        async with membot_run(workspace, llm, **env) as service:
            await fake.wait_until(lambda: any("PART-3" in text for text in fake.bot_texts(dm)), timeout=30)
            await stop(service)
        assert [text.split()[0] for text in fake.bot_texts(dm)] == ["PART-1", "PART-2", "PART-3"]
        assert not previews(fake, dm)


async def test_a_new_told_it_waits_for_the_disk_is_finished_after_a_kill(tmp_path: Path) -> None:
    """/new cleared the conversation, but the disk refused its save: the chat is told "I'll finish /new
    as soon as I can". A slash command is not delivered again after a kill, so that promise held only
    while the process lived: the next start showed the old conversation. Now the /new is kept in the
    inbox before the chat is told, and the next start finishes it."""
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeDiscord() as fake:
        alice, dm = fake.user("alice"), fake.dm_channel()
        env = {**discord_env(fake, alice), "MEMBOT_DISCORD__STREAMING": "false"}
        async with membot_run(workspace, llm, **env) as service:
            await fake.user_message(channel_id=dm, author=alice, content="remember the milk")
            await fake.wait_until(lambda: "echo: remember the milk" in fake.bot_texts(dm), timeout=30)
            await answered(workspace, "discord:" + dm)  # /new then runs at once, kept nowhere
            repair = break_folder(workspace / "sessions")  # no session can be saved now
            await fake.slash_command("new", channel_id=dm, user=alice)
            await fake.wait_until(lambda: any("finish /new" in t for t in fake.bot_texts(dm)), timeout=30)
            await service.kill()
        repair()
        assert await asyncio.to_thread(stored, workspace, "discord:" + dm) != []  # (the kill came first)
        async with membot_run(workspace, llm, **env) as service:
            await fake.wait_until(lambda: "Session cleared." in fake.bot_texts(dm), timeout=30)
            await stop(service)
        assert fake.bot_texts(dm)[::2] == ["echo: remember the milk", "Session cleared."]
    assert await asyncio.to_thread(stored, workspace, "discord:" + dm) == []
