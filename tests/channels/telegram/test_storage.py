"""Storage faults on the Telegram side: nothing that is not stored is confirmed, nothing is lost or
doubled when storage comes back, retries back off and an outage is logged once.

The faults are real: a plain file where a folder should be makes every write below it fail with
ENOTDIR, as root too (a chmod would not stop root). The dispatcher side is ``DurableSink``, which
appends each message to its inbox folder with fsync before ``submit`` returns, as the real one does,
and, in the last tests, the real core (dispatcher, inbox, sessions, pipeline) against a fake model.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.channels.telegram.kit import DurableSink, all_taken_in, break_folder, running_channel
from tests.channels.telegram.test_end_to_end import settings_for, telegram_bot
from tests.channels.telegram.test_polling import offsets
from tests.fakes.llm_server import FakeLLMServer
from tests.fakes.telegram_server import FakeTelegramServer


def logged(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == event]


@pytest.mark.parametrize("restart", [False, True], ids=["storage-returns", "restart-after-repair"])
async def test_a_full_disk_confirms_nothing_and_each_message_arrives_once_when_storage_returns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, restart: bool
) -> None:
    state, inbox = tmp_path / "state", tmp_path / "inbox"
    sink = DurableSink(inbox)
    async with FakeTelegramServer() as tg:
        async with running_channel(tg, tmp_path, sink, state_dir=state):
            repairs = [break_folder(inbox), break_folder(state)]  # every write fails, as on a full disk
            tg.push_message("written during the outage")
            polls = len(offsets(tg))
            await tg.wait_for(lambda: len(offsets(tg)) >= polls + 6)  # fetched, not stored, again and again
            assert 2 not in offsets(tg) and sink.received == []
            if not restart:
                for repair in repairs:
                    repair()
                await sink.wait_for(1)
                await tg.wait_for(lambda: 2 in offsets(tg))
        if restart:
            assert 2 not in offsets(tg)  # stopping did not confirm it either: Telegram still has it
            for repair in repairs:
                repair()
            async with running_channel(tg, tmp_path, sink, state_dir=state):
                tg.push_message("sentinel")
                await sink.wait_for(2)
    assert [m.text for m in sink.received][:1] == ["written during the outage"]
    assert [m.text for m in sink.received].count("written during the outage") == 1
    [outage] = logged(caplog, "storage_unavailable")  # once for the outage, not once per retry
    assert outage["what"] == "the Telegram update journal" and "NotADirectoryError" in str(outage["error"])
    if not restart:
        assert len(logged(caplog, "storage_recovered")) == 1


@pytest.mark.parametrize("restart", [False, True], ids=["storage-returns", "restart-after-repair"])
async def test_a_message_the_dispatcher_cannot_store_is_kept_and_retried_never_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, restart: bool
) -> None:
    state, inbox = tmp_path / "state", tmp_path / "inbox"
    sink = DurableSink(inbox)
    async with FakeTelegramServer() as tg:
        async with running_channel(tg, tmp_path, sink, state_dir=state):
            repair = break_folder(inbox)
            tg.push_message("kept")
            tg.push_message("kept too")
            await sink.wait_until(lambda: sink.attempts >= 6)  # more than the 3 tries that used to drop it
            assert sink.received == []
            assert 3 in offsets(tg)  # confirmed: it is in the channel's journal, which is fine
            if not restart:
                repair()
                await sink.wait_for(2)
        if restart:
            repair()
            async with running_channel(tg, tmp_path, sink, state_dir=state):
                tg.push_message("sentinel")
                await sink.wait_for(3)
    texts = [m.text for m in sink.received]
    assert texts[:2] == ["kept", "kept too"] and len(texts) == (3 if restart else 2)  # in order, once each
    [outage] = logged(caplog, "storage_unavailable")
    assert outage["what"] == "taking Telegram messages in"
    retries = [r for r in logged(caplog, "storage_still_unavailable") if r["level"] == "debug"]
    assert len(retries) >= 5


async def user_turns(llm: FakeLLMServer) -> list[list[str]]:
    return [[m["content"] for m in r.body["messages"] if m["role"] == "user"] for r in llm.requests]


async def wait_logged(caplog: pytest.LogCaptureFixture, event: str, count: int) -> None:
    async with asyncio.timeout(20):
        while len(logged(caplog, event)) < count:
            await asyncio.sleep(0.02)


async def test_a_full_disk_under_the_real_core_answers_each_message_once_and_keeps_it_once(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        settings = await settings_for(workspace, llm, tg)
        async with telegram_bot(settings, storage_retry_delay=0.02, storage_retry_max_delay=0.2):
            repairs = [break_folder(workspace / "inbox"), break_folder(workspace / "state")]
            tg.push_message("written on a full disk")
            polls = len(offsets(tg))
            await tg.wait_for(lambda: len(offsets(tg)) >= polls + 6)  # fetched, not stored, again and again
            assert 2 not in offsets(tg) and tg.sent_to(777) == []
            for repair in repairs:
                repair()
            [reply] = await tg.wait_for_messages(1)
            await tg.wait_for(lambda: 2 in offsets(tg))
    assert reply.text == "echo: written on a full disk"
    assert await user_turns(llm) == [["written on a full disk"]]  # in the session once, not once per try


async def test_an_inbox_that_cannot_be_written_under_the_real_core_keeps_each_message_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    workspace = tmp_path / "ws"
    async with FakeLLMServer() as llm, FakeTelegramServer() as tg:
        settings = await settings_for(workspace, llm, tg)
        async with telegram_bot(settings, storage_retry_delay=0.02, storage_retry_max_delay=0.2):
            repair = break_folder(workspace / "inbox")  # the journal in state/ still works
            tg.push_message("the inbox is broken")
            await wait_logged(caplog, "storage_still_unavailable", 3)
            repair()
            await tg.wait_for_messages(1)
    assert len(tg.sent_to(777)) == 1
    assert await user_turns(llm) == [["the inbox is broken"]]


async def test_the_health_check_clears_once_an_intake_storage_refused_goes_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stranger's pairing code cannot be stored (pairing.json below a plain file), so the intake waits
    and /healthz names "taking Telegram messages in"; once the write goes through, the entry goes too.
    (Only a paste-joiner submit used to clear it: a chat with no message for the dispatcher left the
    health check failing for good.)"""
    workspace, state = tmp_path / "ws", tmp_path / "state"
    async with FakeTelegramServer() as tg, running_channel(tg, workspace, state_dir=state) as (channel, _):
        repair = break_folder(workspace)
        tg.push_message("let me in", chat_id=99, user_id=99, first_name="Mallory")
        await tg.wait_for(lambda: bool(logged(caplog, "storage_unavailable")))
        assert "taking Telegram messages in" in channel.health.storage_errors
        repair()
        await tg.wait_for_messages(1, chat_id=99)  # the offer: the code is stored
        await all_taken_in(state)
        assert channel.health.storage_errors == {}
    [recovered] = logged(caplog, "storage_recovered")
    assert recovered["what"] == "taking Telegram messages in"
    [outage] = logged(caplog, "storage_unavailable")  # a refused write: the disk's fix
    assert "free disk space" in str(outage["hint"])


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ('{"version": 99, "pending": [], "approved": []}', "run that membot again"),
        ("{not json", "fix or delete it"),
    ],
    ids=["newer", "damaged"],
)
async def test_an_unreadable_pairing_file_is_logged_with_its_own_fix_not_the_disks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, said: str
) -> None:
    """The intake's outage said "free disk space or fix the workspace's permissions" beside an error
    saying pairing.json was damaged or a newer membot's: neither helps there. The hint now points at the
    error's own fix."""
    workspace, state = tmp_path / "ws", tmp_path / "state"
    workspace.mkdir()
    (workspace / "pairing.json").write_text(content)
    async with FakeTelegramServer() as tg, running_channel(tg, workspace, state_dir=state):
        tg.push_message("let me in", chat_id=1001, user_id=1001, first_name="Stranger")
        await tg.wait_for(lambda: bool(logged(caplog, "storage_unavailable")))
    [outage] = logged(caplog, "storage_unavailable")
    assert outage["what"] == "taking Telegram messages in" and said in str(outage["error"])
    assert "free disk space" not in str(outage["hint"]) and "as the error says" in str(outage["hint"])


async def test_chats_waiting_for_an_unreadable_pairing_file_hold_back_no_other_chat(tmp_path: Path) -> None:
    """A pairing.json this membot refuses (a newer one's, after a rollback) stays so until the operator
    acts: every stranger's and paired user's private message waits for it. Each waiting chat held one of
    the hand-over's 8 workers while it waited, so 8 of them stopped the bot for everyone, the users in
    the allowlists (whom the refusal says it does not affect) and the groups included."""
    workspace, state = tmp_path / "ws", tmp_path / "state"
    workspace.mkdir()
    (workspace / "pairing.json").write_text('{"version": 99, "pending": [], "approved": []}')
    async with FakeTelegramServer() as tg, running_channel(tg, workspace, state_dir=state) as (channel, sink):
        for n in range(1, 11):  # more waiting chats than workers
            tg.push_message(f"let me in {n}", chat_id=1000 + n, user_id=1000 + n, first_name="Stranger")
        tg.push_message("the owner, allowlisted")  # user 42, in a private chat
        [taken] = await sink.wait_for(1)
        assert taken.text == "the owner, allowlisted"
        assert "taking Telegram messages in" in channel.health.storage_errors  # the strangers still wait
        (workspace / "pairing.json").write_text('{"version": 1, "pending": [], "approved": []}')
        strangers = [1000 + n for n in range(1, 11)]
        await tg.wait_for(lambda: all(tg.sent_to(chat) for chat in strangers))  # then each gets the offer
        assert [len(tg.sent_to(chat)) for chat in strangers] == [1] * 10


async def test_a_message_waiting_for_the_pairing_file_at_a_restart_holds_back_no_other_chat(
    tmp_path: Path,
) -> None:
    """A stranger's message still waiting for an unreadable pairing.json when the bot restarts is held
    from the earlier run, and those are taken in before anything new: the whole bot waited for the
    operator to fix the file. It counts as taken in now; once the file is readable it gets its offer."""
    workspace, state = tmp_path / "ws", tmp_path / "state"
    workspace.mkdir()
    (workspace / "pairing.json").write_text('{"version": 99, "pending": [], "approved": []}')
    async with FakeTelegramServer() as tg:
        async with running_channel(tg, workspace, state_dir=state) as (_, sink):
            tg.push_message("let me in", chat_id=1001, user_id=1001, first_name="Stranger")
            tg.push_message("before the restart")  # user 42, allowlisted: taken after the stranger's
            await sink.wait_for(1)
        async with running_channel(tg, workspace, state_dir=state) as (_, sink):
            tg.push_message("after the restart")
            [taken] = await sink.wait_for(1)
            assert taken.text == "after the restart"
            assert tg.sent_to(1001) == []
            (workspace / "pairing.json").write_text('{"version": 1, "pending": [], "approved": []}')
            await tg.wait_for_messages(1, chat_id=1001)  # the offer, once
    assert len(tg.sent_to(1001)) == 1


async def test_a_message_of_the_earlier_run_taken_in_late_is_joined_to_nothing_new(tmp_path: Path) -> None:
    """A paired user's message held from the earlier run waits for the pairing file past the start;
    their next message waits behind it. Once the file can be read, the old one is handed on by itself:
    the dispatcher may have it already, and a new message joined to it would go with the redelivery."""
    workspace, state = tmp_path / "ws", tmp_path / "state"
    workspace.mkdir()
    pairing = workspace / "pairing.json"
    pairing.write_text('{"version": 99, "pending": [], "approved": []}')
    approved = {"channel": "telegram", "user_id": "1001", "approved_at": "2026-01-01T00:00:00+00:00"}
    async with FakeTelegramServer() as tg:
        async with running_channel(tg, workspace, state_dir=state) as (_, sink):
            tg.push_message("the old one", chat_id=1001, user_id=1001, first_name="Paired")
            tg.push_message("owner")  # user 42, allowlisted: taken after the paired user's update
            await sink.wait_for(1)
        async with running_channel(tg, workspace, state_dir=state, join_window=2.0) as (_, sink):
            tg.push_message("the new one", chat_id=1001, user_id=1001, first_name="Paired")
            tg.push_message("owner again")
            await sink.wait_until(lambda: any(m.text == "owner again" for m in sink.received))
            pairing.write_text(json.dumps({"version": 1, "pending": [], "approved": [approved]}))
            await sink.wait_until(lambda: any(m.text == "the new one" for m in sink.received))
    assert [m.text for m in sink.received if m.chat_id == "1001"] == ["the old one", "the new one"]


async def test_messages_waiting_for_storage_go_in_as_soon_as_another_chats_goes_through(
    tmp_path: Path,
) -> None:
    """A message the dispatcher's disk refused waited out its pause (up to ``storage_retry_max_delay``)
    after the operator freed space, though other chats' messages went in meanwhile: now the first one
    that goes through wakes the ones that wait."""
    state, inbox = tmp_path / "state", tmp_path / "inbox"
    sink = DurableSink(inbox)
    async with (
        FakeTelegramServer() as tg,
        running_channel(
            tg,
            tmp_path,
            sink,
            state_dir=state,
            allowed_users=["42", "43", "44"],
            storage_retry_delay=300.0,  # a pause no test waits out: a message in time was woken
            storage_retry_max_delay=300.0,
        ),
    ):
        repair = break_folder(inbox)  # the dispatcher's disk is full; the channel's journal is not
        tg.push_message("waits", chat_id=42, user_id=42)
        tg.push_message("waits too", chat_id=43, user_id=43)
        await sink.wait_until(lambda: sink.attempts >= 2)  # each refused, each in its pause
        assert sink.received == []
        repair()  # the operator frees space
        tg.push_message("goes through", chat_id=44, user_id=44)
        async with asyncio.timeout(10):  # far short of the pause: they were woken, not timed out
            await sink.wait_for(3)
    assert sorted(m.text for m in sink.received) == ["goes through", "waits", "waits too"]  # once each


async def test_a_chat_waiting_for_storage_at_the_hand_over_goes_on_once_another_chats_goes_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stranger's pairing code the disk refused waited out its lane's pause (up to
    ``storage_retry_max_delay``) after the operator freed space, though other chats' messages went in
    meanwhile: now the first one that goes through wakes the lanes that wait."""
    workspace, state = tmp_path / "ws", tmp_path / "state"
    async with (
        FakeTelegramServer() as tg,
        running_channel(
            tg,
            workspace,
            state_dir=state,
            storage_retry_delay=300.0,  # a pause no test waits out: a lane in time was woken
            storage_retry_max_delay=300.0,
        ) as (_, sink),
    ):
        repair = break_folder(workspace)  # pairing.json cannot be written: the stranger's lane waits
        tg.push_message("let me in", chat_id=99, user_id=99, first_name="Mallory")
        await tg.wait_for(lambda: bool(logged(caplog, "storage_unavailable")))
        repair()  # the operator frees space
        tg.push_message("hello")  # an allowed user's message goes in
        await sink.wait_for(1)
        async with asyncio.timeout(10):  # far short of the pause: the lane was woken, not timed out
            [offer] = await tg.wait_for_messages(1, chat_id=99)
    assert "pair" in offer.text.lower()
