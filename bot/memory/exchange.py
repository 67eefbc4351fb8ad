"""Linux's atomic name exchange, guarded by a look before and a look after, in one uninterrupted step.

``renameat2(RENAME_EXCHANGE)`` swaps two names atomically, so a file replaced this way is still on disk
afterwards and can be checked. :func:`exchange_if` looks at the target (is it still the version the
change was based on?), exchanges, looks at what was displaced and, if an editor saved in between,
exchanges back. The three system calls go through :class:`ctypes.PyDLL`, which keeps the GIL for the
whole call, so no other thread of ours (the event loop above all) runs in between: the new version is
visible to others for the time of a few system calls, not for a thread switch (Python's switch interval
is 5 ms, and a test editor read the half-done state through exactly that gap). Another process can
still read it in those microseconds (longer if the kernel preempts us there), so on a trade-back the
version put back is handed over open: the caller knows exactly what a reader of ours may have missed.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import os
import struct
from collections.abc import Callable
from pathlib import Path

Stamp = tuple[int, int, int]  # inode, size, mtime_ns: what a save changes (our renames change ctime)

_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_STATX_BASIC_STATS = 0x7FF
_RENAME_EXCHANGE = 2  # linux/fs.h
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV}


class Outcome(enum.Enum):
    MOVED = "moved"  # the file is not the expected version: nothing was done
    MISSING = "missing"  # no file, as expected: the caller creates it
    SWAPPED = "swapped"  # the new version is in place; the displaced one is under the temp name
    TRADED_BACK = "traded back"  # someone saved in between: their version is in place again


class Unsupported(OSError):
    """This filesystem (or system) cannot exchange names: use a plain rename."""


class Stranded(OSError):
    """The exchange back failed: the editor's newer version is under the temp name; keep it."""


def _libc() -> tuple[Callable[..., int], Callable[..., int], Callable[..., int]] | None:
    try:
        libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held during each call
        return libc.renameat2, libc.statx, libc.open
    except (AttributeError, OSError):  # not Linux, or a C library without them (glibc < 2.28)
        return None


_CALLS = _libc()
AVAILABLE = _CALLS is not None


def _statx(path: bytes) -> Stamp | None:
    assert _CALLS is not None
    buf = ctypes.create_string_buffer(256)  # struct statx is 256 bytes on every architecture
    if _CALLS[1](_AT_FDCWD, path, _AT_SYMLINK_NOFOLLOW, _STATX_BASIC_STATS, buf) != 0:
        code = ctypes.get_errno()
        if code == errno.ENOENT:
            return None
        raise OSError(code, os.strerror(code), os.fsdecode(path))
    ino, size = struct.unpack_from("=QQ", buf, 32)
    seconds, nanos = struct.unpack_from("=qI", buf, 112)  # stx_mtime
    return ino, size, seconds * 1_000_000_000 + nanos


def _rename_exchange(a: bytes, b: bytes) -> int:
    assert _CALLS is not None
    return 0 if _CALLS[0](_AT_FDCWD, a, _AT_FDCWD, b, _RENAME_EXCHANGE) == 0 else ctypes.get_errno()


def exchange_if(tmp: str, path: Path, expected: Stamp | None) -> tuple[Outcome, int | None]:
    """Exchange ``tmp`` and ``path`` if ``path`` is the version stamped ``expected`` (None: no file).

    On ``TRADED_BACK`` the second value is a descriptor open on the version put back in place (the
    caller closes it; None if it could not be opened); otherwise None.
    """
    source, target = os.fsencode(tmp), os.fsencode(path)
    now = _statx(target)
    if now is None:
        return (Outcome.MISSING if expected is None else Outcome.MOVED), None
    if now != expected:
        return Outcome.MOVED, None
    code = _rename_exchange(source, target)
    if code in _NO_EXCHANGE:
        raise Unsupported(code, os.strerror(code), str(path))
    if code == errno.ENOENT:
        return Outcome.MOVED, None
    if code:
        raise OSError(code, os.strerror(code), str(path))
    if _statx(source) == expected:
        return Outcome.SWAPPED, None
    assert _CALLS is not None
    back = _CALLS[2](source, os.O_RDONLY | os.O_CLOEXEC)  # the editor's version, held before it goes back
    code = _rename_exchange(source, target)  # an editor saved in between: theirs goes back at once
    if code:
        if back >= 0:
            os.close(back)
        raise Stranded(code, f"could not put the newer version back ({os.strerror(code)}); it is {tmp}")
    return Outcome.TRADED_BACK, (back if back >= 0 else None)
