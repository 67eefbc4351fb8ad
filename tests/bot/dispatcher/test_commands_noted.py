"""A command that changes nothing (/help, /status) is noted as run in its session, and the note reaches
the disk: a platform that hands it over again after the restart (Discord's catch-up from a mark that
lagged, Telegram after a kill) does not get it answered twice. The note waited for the session's next
save, which a shutdown did not make when no message had changed, a kill never made, and an eviction
from the session cache skipped (the session counted as saved), so every such command ran again.
"""

from __future__ import annotations

from pathlib import Path

from bot import intake
from bot.inbox import Inbox
from bot.sessions import JsonSessionStore
from tests.bot.test_dispatcher import ModelSystem
from tests.bot.test_dispatcher_recovery import msg, settled, started


async def test_a_command_that_changed_nothing_is_not_run_again_after_a_restart(tmp_path: Path) -> None:
    dispatcher, channel, _ = await started(tmp_path, ModelSystem())
    await dispatcher.submit(msg("hello", message_id="1"))
    await channel.wait_for(1)
    await settled(tmp_path)
    await dispatcher.submit(msg("/help", message_id="2"))
    await channel.wait_for(2)
    await dispatcher.close(grace=1)

    restarted, channel2, _ = await started(tmp_path, ModelSystem())
    await restarted.submit(msg("/help", message_id="2"))  # handed over again
    await restarted.submit(msg("/help", message_id="3"))  # a new one
    await channel2.wait_for(1)
    await restarted.close(grace=1)

    assert [m.text.splitlines()[0] for m in channel2.sent] == ["Commands:"]
    assert channel2.sent[0].reply_to == "3"


async def test_a_noted_command_is_kept_when_its_session_leaves_the_cache(tmp_path: Path) -> None:
    """Another chat's turn makes room in a full session cache: the session whose only change is a command's
    note was evicted as saved, the note went with it, and the restart ran the command again."""
    dispatcher, channel, _ = await started(tmp_path, ModelSystem(), cache_size=1)
    await dispatcher.submit(msg("hello", message_id="1"))
    await channel.wait_for(1)
    await settled(tmp_path)
    await dispatcher.submit(msg("/help", message_id="2"))
    await channel.wait_for(2)
    await dispatcher.submit(msg("hi", message_id="3", chat="c2"))  # its turn makes room in the cache
    await channel.wait_for(3)
    await settled(tmp_path)
    await dispatcher.close(grace=1)

    restarted, channel2, _ = await started(tmp_path, ModelSystem())
    await restarted.submit(msg("/help", message_id="2"))  # handed over again
    await restarted.submit(msg("/help", message_id="4"))  # a new one
    await channel2.wait_for(1)
    await restarted.close(grace=1)

    assert [m.reply_to for m in channel2.sent] == ["4"]


async def test_a_command_is_noted_on_disk_before_its_reply(tmp_path: Path) -> None:
    """A kill after the reply (Telegram hands its last updates over again) does not run it again: the
    note waited for the session's next save, which a kill never made."""
    dispatcher, channel, _ = await started(tmp_path, ModelSystem())
    await dispatcher.submit(msg("hello", message_id="1"))
    await channel.wait_for(1)
    await dispatcher.settled("test:c1")  # the turn let go of the session (its own save came before)
    await dispatcher.submit(msg("/help", message_id="2"))
    await channel.wait_for(2)

    on_disk = await JsonSessionStore(tmp_path / "sessions", read_only=True).load("test:c1")
    await dispatcher.close(grace=1)
    assert on_disk is not None and intake.command_run(on_disk, "2")


async def test_a_new_noted_on_disk_whose_reply_was_not_kept_yet_tells_the_chat_after_a_restart(
    tmp_path: Path,
) -> None:
    """A kill between /new's save (its note with the cleared conversation) and the keeping of its reply in
    the inbox leaves what is set up here: /new pending in the inbox, noted as run. The restart does not
    run it again, and the chat, never told, is told now (the reply was lost, and the chat never learnt
    its conversation was cleared)."""
    dispatcher, channel, _ = await started(tmp_path, ModelSystem())
    await dispatcher.submit(msg("hello", message_id="1"))
    await channel.wait_for(1)
    await settled(tmp_path)
    await dispatcher.close(grace=1)
    _, durable = Inbox(tmp_path / "inbox").add(msg("/new", message_id="2"))
    await durable
    store = JsonSessionStore(tmp_path / "sessions")
    session = await store.load("test:c1")
    assert session is not None
    session.replace_messages([])
    intake.note_command(session, "2")
    await store.save(session)

    restarted, channel2, _ = await started(tmp_path, ModelSystem())
    await restarted.submit(msg("/new", message_id="2"))  # handed over again
    await channel2.wait_for(1)
    await settled(tmp_path)
    await restarted.close(grace=1)
    assert [m.text for m in channel2.sent] == ["/new is done."]
