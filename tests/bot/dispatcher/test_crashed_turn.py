"""A turn that fails outside the pipeline (its session cannot be read) still gets the chat a reply.

The pipeline turns each system's failure into the turn's reply, but a turn can fail around it: the
session's file cannot be read (a permission, a disk error). The dispatcher logged it and went on, and
the chat got nothing at all, message after message. Now it is told once, in plain words, and the read is
tried again until storage takes it (bot/dispatcher/turns.py); the message stays in the inbox meanwhile.
"""

from __future__ import annotations

from pathlib import Path

from tests.bot.test_dispatcher import ModelSystem
from tests.bot.test_dispatcher_recovery import msg, pending, started


async def test_a_turn_whose_session_cannot_be_read_tells_the_chat_and_a_restart_meanwhile_answers_it(
    tmp_path: Path,
) -> None:
    """The read is tried again until it goes through, as a save is (answered then without a restart:
    tests/bot/test_dispatcher_recovery.py); a shutdown meanwhile leaves the message to the next start."""
    dispatcher, channel, sessions = await started(tmp_path, ModelSystem())
    # Reading it fails as a disk error would (ELOOP; a folder in its place is moved aside since: it never
    # becomes readable by itself, bot/sessions.py).
    unreadable = sessions.store.header_path("test:c1")
    unreadable.parent.mkdir(parents=True, exist_ok=True)
    unreadable.symlink_to(unreadable.name)
    await dispatcher.submit(msg("hello", message_id="1"))
    await channel.wait_for(1)
    waiting = dispatcher.storage_wait("test:c1")
    await dispatcher.close(grace=0.2)
    told = list(channel.sent)
    kept = await pending(tmp_path)

    assert [(m.reply_to, m.is_error) for m in told] == [("1", True)]
    assert "I'll answer as soon as I can" in told[0].text
    assert "test:c1.json" not in told[0].text  # the details are the operator's, in the log
    assert waiting == "session_load"
    assert kept == ["hello"]

    unreadable.unlink()  # the operator fixed it
    restarted, channel2, _ = await started(tmp_path, ModelSystem())
    await channel2.wait_for(1)
    await restarted.close(grace=1)
    assert [m.text for m in channel2.sent] == ["answer to hello"]
