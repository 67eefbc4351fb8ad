"""Hand memory that the C allocator holds freed back to the operating system.

glibc's malloc keeps freed blocks for reuse instead of returning them, so a process stays at its peak:
onnxruntime's activations for a batch of long texts and the embedding model's load left 40-60 MB
resident in a bot that had gone idle. ``malloc_trim`` gives back what is free (a few milliseconds). It
is glibc's alone; elsewhere (macOS, musl) :func:`release_free_memory` does nothing, and those
allocators return memory on their own terms.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the C library this interpreter runs on
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)  # glibc only
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim  # type: ignore[no-any-return]


def release_free_memory() -> bool:
    """Return the allocator's free memory to the system; whether it could. Blocking: call in a thread."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
