"""PairingStore: codes, expiry, the pending cap, persistence, and the CLI seeing the bot's file."""

from __future__ import annotations

import asyncio
import json
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.errors import StorageError
from bot.pairing import (
    PAIRING_FILE,
    PairingStore,
    approve_code,
    list_pairings,
    normalize_code,
    revoke_user,
)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def store_in(tmp_path: Path, clock: Clock) -> PairingStore:
    return PairingStore(tmp_path / "ws" / PAIRING_FILE, clock=clock)


async def test_request_gives_a_short_code_and_the_same_code_again(tmp_path: Path, clock: Clock) -> None:
    store = store_in(tmp_path, clock)
    code = await store.request("telegram", "42", "Alice")
    assert code is not None and len(code) == 9 and code[4] == "-"
    assert await store.request("telegram", "42", "Alice") == code
    assert [r.user_id for r in await store.pending()] == ["42"]


async def test_approve_admits_exactly_that_user_on_that_channel(tmp_path: Path, clock: Clock) -> None:
    store = store_in(tmp_path, clock)
    code = await store.request("telegram", "42", "Alice")
    assert code is not None
    assert not await store.is_approved("telegram", "42")
    approval = await store.approve(code.lower().replace("-", " "))  # typed sloppily
    assert approval is not None and approval.user_id == "42" and approval.user_name == "Alice"
    assert await store.is_approved("telegram", "42")
    assert not await store.is_approved("telegram", "4")
    assert not await store.is_approved("discord", "42")
    assert await store.pending() == []
    assert await store.approve(code) is None  # one-time


async def test_codes_expire_after_an_hour(tmp_path: Path, clock: Clock) -> None:
    store = store_in(tmp_path, clock)
    code = await store.request("telegram", "42")
    assert code is not None
    clock.now += timedelta(minutes=61)
    assert await store.pending() == []
    assert await store.approve(code) is None
    fresh = await store.request("telegram", "42")
    assert fresh is not None and fresh != code


async def test_at_most_three_pending_per_channel(tmp_path: Path, clock: Clock) -> None:
    store = store_in(tmp_path, clock)
    codes = [await store.request("telegram", str(uid)) for uid in (1, 2, 3)]
    assert all(codes) and len(set(codes)) == 3
    assert await store.request("telegram", "4") is None
    assert await store.request("discord", "4") is not None  # the cap is per channel
    assert await store.request("telegram", "2") == codes[1]  # re-request still answered
    clock.now += timedelta(hours=2)
    assert await store.request("telegram", "4") is not None  # expired ones free their slot


async def test_approvals_persist_and_the_cli_shares_the_file(tmp_path: Path, clock: Clock) -> None:
    bot = store_in(tmp_path, clock)
    code = await bot.request("telegram", "42", "Alice")
    assert code is not None
    workspace = tmp_path / "ws"

    pending, approved = await asyncio.to_thread(list_pairings, workspace, clock=clock)
    assert [(r.code, r.user_name) for r in pending] == [(code, "Alice")]
    assert approved == []

    approval = await asyncio.to_thread(
        approve_code, workspace, code, clock=clock
    )  # as `membot pairing approve` does
    assert approval is not None
    assert await bot.is_approved("telegram", "42")  # the running bot sees it without a restart

    other = await bot.request("telegram", "7", "Bob")  # the bot's write keeps the CLI's approval
    assert other is not None
    restarted = store_in(tmp_path, clock)
    assert await restarted.is_approved("telegram", "42")
    assert [r.user_id for r in await restarted.pending()] == ["7"]

    path = workspace / PAIRING_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["version"] == 1

    assert await asyncio.to_thread(revoke_user, workspace, "telegram", "42")
    assert not await bot.is_approved("telegram", "42")
    assert not await asyncio.to_thread(revoke_user, workspace, "telegram", "42")


@pytest.mark.parametrize("text", ["{not json", "[]", '"approved"', "null"])
async def test_a_corrupt_file_names_itself(tmp_path: Path, clock: Clock, text: str) -> None:
    """Valid JSON that is no object too (a list left by a hand edit): it was an AttributeError."""
    path = tmp_path / "ws" / PAIRING_FILE
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(StorageError, match=r"pairing\.json"):
        await PairingStore(path, clock=clock).is_approved("telegram", "1")


async def test_a_file_from_a_newer_membot_is_refused_and_left_as_it_is(tmp_path: Path, clock: Clock) -> None:
    """pairing.json of a newer format (a rollback) was read as version 1 and rewritten at the next
    request or approval, its unknown fields dropped. Now every use is refused with an error that names
    the file and the fix, and its bytes stay as they were."""
    path = tmp_path / "ws" / PAIRING_FILE
    path.parent.mkdir(parents=True)
    newer = {
        "version": 2,
        "pending": [],
        "approved": [
            {
                "channel": "telegram",
                "user_id": "42",
                "user_name": "Alice",
                "approved_at": "2025-01-01T11:00:00+00:00",
                "until": "2025-01-01T11:30:00+00:00",  # a field version 1 knows nothing of
            }
        ],
        "denied": [{"channel": "telegram", "user_id": "7"}],
    }
    path.write_text(json.dumps(newer, indent=2))
    before = path.read_bytes()
    store = PairingStore(path, clock=clock)
    newer_membot = r"pairing\.json was written by a newer membot \(format 2; this one reads up to 1\)"
    with pytest.raises(StorageError, match=newer_membot) as refused:
        await store.is_approved("telegram", "42")
    assert "run that membot again, or restore a backup" in str(refused.value)
    with pytest.raises(StorageError, match=newer_membot):
        await store.request("telegram", "7", "Mallory")
    with pytest.raises(StorageError, match=newer_membot):
        await asyncio.to_thread(revoke_user, tmp_path / "ws", "telegram", "42")
    with pytest.raises(StorageError, match=newer_membot):
        await asyncio.to_thread(list_pairings, tmp_path / "ws", clock=clock)
    assert path.read_bytes() == before


def test_normalize_code() -> None:
    assert normalize_code("abcd efgh") == "ABCD-EFGH"
    assert normalize_code(" ABCD-EFGH ") == "ABCD-EFGH"
    assert normalize_code("abc") == "ABC"


def test_a_user_approved_in_the_file_is_approved_for_every_thread_that_asks_first(tmp_path: Path) -> None:
    """Channels ask from worker threads, several at once (two chats' messages). The first read of a
    changed file must not let another thread see the new stamp with the old (empty) approvals: that
    denied an approved user's message, or offered them a code again."""
    path = tmp_path / PAIRING_FILE
    code = PairingStore(path).request_sync("discord", "42", "bob")
    assert code is not None and PairingStore(path).approve_sync(code) is not None
    denied = 0
    for _ in range(200):
        store = PairingStore(path)  # a fresh reader, as a bot just started
        start = threading.Barrier(4)

        def ask(store: PairingStore = store, start: threading.Barrier = start) -> bool:
            start.wait()
            return store.is_approved_sync("discord", "42")

        with ThreadPoolExecutor(4) as pool:
            denied += [f.result() for f in [pool.submit(ask) for _ in range(4)]].count(False)
    assert denied == 0


async def test_asks_refused_for_a_full_channel_leave_the_file_alone(tmp_path: Path, clock: Clock) -> None:
    """With the channel's pending codes at the maximum, each further stranger's ask is refused, but each
    still rewrote and fsynced pairing.json (a Discord slash command must be answered and is not paced,
    so a flood of them was a write each); an unknown code or a revoke of nobody wrote it too."""
    store = store_in(tmp_path, clock)
    assert all([await store.request("discord", str(uid)) for uid in (1, 2, 3)])
    path = tmp_path / "ws" / PAIRING_FILE
    written = path.stat()
    for _ in range(5):
        assert await store.request("discord", "4") is None
    assert await store.approve("ZZZZ-ZZZZ") is None
    assert not await asyncio.to_thread(store.revoke_sync, "discord", "9")
    now = path.stat()
    assert (now.st_ino, now.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    assert [r.user_id for r in await store.pending()] == ["1", "2", "3"]
