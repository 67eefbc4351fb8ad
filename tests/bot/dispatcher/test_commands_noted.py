"""A command that changes nothing (/help, /status) is noted as run in its session, and the note reaches
the disk by the shutdown: a platform that hands it over again after the restart (Discord's catch-up
from a mark that lagged) does not get it answered twice. The note waited for the session's next save,
which a shutdown did not make when no message had changed, so every such command ran again.
"""

from __future__ import annotations

from pathlib import Path

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
