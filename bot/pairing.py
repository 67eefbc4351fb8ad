"""Pairing: how an unknown user in a private chat asks for access and an operator grants it.

The channel answers an unknown user with a short one-time code (:meth:`PairingStore.request`); the
operator runs ``membot pairing approve CODE`` (:func:`approve_code`) and from then on
:meth:`PairingStore.is_approved` admits that user on that channel. Codes expire after an hour and at
most three wait per channel, so a stranger cannot flood the operator.

Everything lives in one JSON file in the workspace (``pairing.json``), shared by the running bot and
the CLI, which are different processes. Every change is a read-modify-write under an advisory file
lock, written atomically, so neither side loses the other's update; reads pick up changes by the file's
modification stamp.

    store = PairingStore(settings.workspace / PAIRING_FILE)
    code = await store.request("telegram", "42", "Alice")      # -> "K7QH-3MZP"
    approve_code(settings.workspace, code)                      # the CLI, in another process
    await store.is_approved("telegram", "42")                   # -> True
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bot.domain import parse_time, utcnow
from bot.errors import StorageError
from bot.storage import atomic_write_text, ensure_private_dir, refuse_newer

PAIRING_FILE = "pairing.json"
PAIRING_VERSION = 1
CODE_TTL = timedelta(hours=1)
MAX_PENDING_PER_CHANNEL = 3
# A stranger is offered a code at most once in this many seconds (:class:`OfferPacing`).
OFFER_INTERVAL = 60.0
_OFFERS_REMEMBERED = 1024  # strangers noted before those whose interval is over are forgotten
# No 0/O, 1/I/L: codes are read aloud and typed from a phone screen.
_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"

Clock = Callable[[], datetime]

# What a refused (newer) pairing.json means until it is fixed, said with its error.
_MEANWHILE = "until then no pairing can be checked or granted (users in the allowlists are not affected)"


@dataclass(frozen=True, slots=True)
class PairingRequest:
    """A code waiting for an operator."""

    code: str
    channel: str
    user_id: str
    user_name: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Approval:
    """A user admitted on one channel by an operator."""

    channel: str
    user_id: str
    user_name: str
    approved_at: datetime
    code: str = ""


@dataclass(slots=True)
class _State:
    pending: list[PairingRequest]
    approved: list[Approval]


class OfferPacing:
    """Whether a stranger may be offered a code now: at most once per :data:`OFFER_INTERVAL` each.

    Each offer is a write of ``pairing.json`` and a message out, paced per chat by the platform: answering
    every message of a stranger's flood held up every allowed user's messages behind it on Telegram
    (updates were taken in one at a time then; ten took seven seconds) and made a write per message
    anywhere.
    Asking again after the interval gives the same code while it is valid. In memory only: a restart
    allows one more offer, which is harmless."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._offered: dict[str, float] = {}  # a stranger's user id -> when they were last offered a code

    def may_offer(self, user_id: str) -> bool:
        """Whether ``user_id`` may be offered a code now; notes the offer when so."""
        now = self._monotonic()
        last = self._offered.get(user_id)
        if last is not None and now - last < OFFER_INTERVAL:
            return False
        if len(self._offered) >= _OFFERS_REMEMBERED:
            self._offered = {u: t for u, t in self._offered.items() if now - t < OFFER_INTERVAL}
        self._offered[user_id] = now
        return True


def new_code() -> str:
    """Eight unambiguous characters shown as ``XXXX-XXXX`` (about 40 bits; it expires in an hour)."""
    raw = "".join(secrets.choice(_ALPHABET) for _ in range(8))
    return f"{raw[:4]}-{raw[4:]}"


def normalize_code(code: str) -> str:
    """Accept what people type: any case, with or without the dash or spaces."""
    raw = "".join(ch for ch in code.upper() if ch.isalnum())
    return f"{raw[:4]}-{raw[4:]}" if len(raw) == 8 else raw


class PairingStore:
    """Pending pairing codes and approved users, persisted in one file (see the module doc).

    The async methods run file I/O in a thread; the ``*_sync`` functions below serve the CLI.
    """

    def __init__(
        self,
        path: Path,
        *,
        clock: Clock = utcnow,
        ttl: timedelta = CODE_TTL,
        max_pending: int = MAX_PENDING_PER_CHANNEL,
    ) -> None:
        self._path = path
        self._clock = clock
        self._ttl = ttl
        self._max_pending = max_pending
        self._state = _State([], [])
        self._stamp: tuple[int, int, int] | None = None
        # Channels ask from worker threads, several at once: the state and its stamp change together,
        # or a thread that saw the new stamp would read the old approvals (an approved user denied).
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self._path

    # -- used by channels (async) -------------------------------------------------------------------

    async def request(self, channel: str, user_id: str, user_name: str = "") -> str | None:
        """The user's pairing code: their existing one if still valid (the file is not written then),
        a new one if there is room.

        ``None`` when the channel already has the maximum of pending codes from other users.
        """
        return await asyncio.to_thread(self.request_sync, channel, str(user_id), user_name)

    async def approve(self, code: str) -> Approval | None:
        return await asyncio.to_thread(self.approve_sync, code)

    async def is_approved(self, channel: str, user_id: str) -> bool:
        return await asyncio.to_thread(self.is_approved_sync, channel, str(user_id))

    async def pending(self) -> list[PairingRequest]:
        return await asyncio.to_thread(self.pending_sync)

    # -- synchronous core (the CLI calls these directly) ----------------------------------------------

    def request_sync(self, channel: str, user_id: str, user_name: str = "") -> str | None:
        # Asked again while the code is valid: that code, and no write. Every ask rewrote and fsynced
        # the file, and a stranger asks as often as they like (each slash command must be answered).
        self._refresh()
        now = self._clock()
        for req in self._state.pending:
            if req.channel == channel and req.user_id == user_id and req.expires_at > now:
                return req.code
        with self._update() as state:
            now = self._clock()
            for req in state.pending:
                if req.channel == channel and req.user_id == user_id:
                    return req.code
            if sum(1 for r in state.pending if r.channel == channel) >= self._max_pending:
                return None
            taken = {r.code for r in state.pending}
            code = new_code()
            while code in taken:
                code = new_code()
            state.pending.append(PairingRequest(code, channel, user_id, user_name, now, now + self._ttl))
            return code

    def approve_sync(self, code: str) -> Approval | None:
        """Admit the user behind ``code``; ``None`` if the code is unknown or expired."""
        wanted = normalize_code(code)
        with self._update() as state:
            for req in state.pending:
                if req.code == wanted:
                    state.pending.remove(req)
                    approval = Approval(req.channel, req.user_id, req.user_name, self._clock(), req.code)
                    state.approved = [
                        a
                        for a in state.approved
                        if not (a.channel == req.channel and a.user_id == req.user_id)
                    ]
                    state.approved.append(approval)
                    return approval
            return None

    def revoke_sync(self, channel: str, user_id: str) -> bool:
        with self._update() as state:
            before = len(state.approved)
            state.approved = [
                a for a in state.approved if not (a.channel == channel and a.user_id == user_id)
            ]
            return len(state.approved) != before

    def is_approved_sync(self, channel: str, user_id: str) -> bool:
        self._refresh()
        return any(a.channel == channel and a.user_id == user_id for a in self._state.approved)

    def pending_sync(self) -> list[PairingRequest]:
        self._refresh()
        now = self._clock()
        return [r for r in self._state.pending if r.expires_at > now]

    def approved_sync(self) -> list[Approval]:
        self._refresh()
        return list(self._state.approved)

    # -- file handling --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _update(self) -> Iterator[_State]:
        """Read-modify-write under an exclusive lock; expired codes are dropped on the way.

        Nothing is written when the state read is left as it was: a refused ask, an unknown code or a
        revoke of nobody (a stranger's unpaced slash commands were a write and an fsync each)."""
        lock_path = self._path.with_name(self._path.name + ".lock")
        with self._lock:
            try:  # a read-only or full disk: the file named, as a refused write of the state is (74)
                ensure_private_dir(self._path.parent)
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                raise StorageError(f"cannot write {lock_path}: {exc.strerror}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._stamp = None
                self._read_if_changed()
                now = self._clock()
                state = _State(
                    [r for r in self._state.pending if r.expires_at > now], list(self._state.approved)
                )
                yield state
                if state == self._state:
                    return
                try:
                    atomic_write_text(self._path, _dump(state))
                except OSError as exc:
                    raise StorageError(f"cannot write {self._path}: {exc.strerror}") from exc
                self._state = state
                self._stamp = _stamp(self._path)
            finally:
                os.close(fd)  # closing the descriptor releases the lock

    def _refresh(self) -> None:
        with self._lock:
            self._read_if_changed()

    def _read_if_changed(self) -> None:
        stamp = _stamp(self._path)
        if stamp == self._stamp and stamp is not None:
            return
        if stamp is None:
            self._state, self._stamp = _State([], []), None
            return
        try:
            self._state = _load(self._path.read_text(encoding="utf-8"), self._path)
            self._stamp = stamp
        except OSError as exc:
            raise StorageError(f"cannot read {self._path}: {exc.strerror}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(
                f"{self._path} is not a valid pairing file ({exc}); fix or delete it to reset pairings"
            ) from exc


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """Changes whenever the file is replaced (atomic writes give it a new inode) or rewritten."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return (info.st_ino, info.st_mtime_ns, info.st_size)


def _dump(state: _State) -> str:
    def encode(item: PairingRequest | Approval) -> dict[str, Any]:
        return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in asdict(item).items()}

    data = {
        "version": PAIRING_VERSION,
        "pending": [encode(r) for r in state.pending],
        "approved": [encode(a) for a in state.approved],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _load(text: str, path: Path) -> _State:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"it holds a JSON {type(data).__name__}, not an object")
    # Newer: its approvals are not read by this version's rules (they may mean less than they seem).
    refuse_newer(data, PAIRING_VERSION, path=path, what="pairing file", meanwhile=_MEANWHILE)
    pending = [
        PairingRequest(
            code=str(r["code"]),
            channel=str(r["channel"]),
            user_id=str(r["user_id"]),
            user_name=str(r.get("user_name", "")),
            created_at=parse_time(r["created_at"]),
            expires_at=parse_time(r["expires_at"]),
        )
        for r in data.get("pending", [])
    ]
    approved = [
        Approval(
            channel=str(a["channel"]),
            user_id=str(a["user_id"]),
            user_name=str(a.get("user_name", "")),
            approved_at=parse_time(a["approved_at"]),
            code=str(a.get("code", "")),
        )
        for a in data.get("approved", [])
    ]
    return _State(pending, approved)


# ---- plain functions for the CLI (`membot pairing approve CODE`, `membot pairing list`) ------------


def approve_code(workspace: Path, code: str, *, clock: Clock = utcnow) -> Approval | None:
    """Approve a pairing code from the command line; ``None`` if it is unknown or expired."""
    return PairingStore(workspace / PAIRING_FILE, clock=clock).approve_sync(code)


def list_pairings(workspace: Path, *, clock: Clock = utcnow) -> tuple[list[PairingRequest], list[Approval]]:
    """(pending codes still valid, approved users) for ``membot pairing list``."""
    store = PairingStore(workspace / PAIRING_FILE, clock=clock)
    return store.pending_sync(), store.approved_sync()


def revoke_user(workspace: Path, channel: str, user_id: str) -> bool:
    """Withdraw an approval (``membot pairing revoke CHANNEL USER_ID``); ``False`` if there was none."""
    return PairingStore(workspace / PAIRING_FILE).revoke_sync(channel, user_id)
