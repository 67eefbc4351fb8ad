"""release_free_memory: freed blocks the C allocator kept go back to the system (glibc)."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

from bot.allocator import release_free_memory

BLOCK = 64 * 1024  # under glibc's mmap threshold: served from the heap, kept there when freed
BLOCKS = 800  # 50 MiB


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_memory_goes_back_to_the_system() -> None:
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(BLOCK) for _ in range(BLOCKS)]
    for block in blocks:
        ctypes.memset(block, 1, BLOCK)  # resident now
    for block in blocks[:-1]:  # the last one stays: free() alone cannot shrink the heap below it
        libc.free(block)
    before = rss_kib()
    assert release_free_memory()
    after = rss_kib()
    libc.free(blocks[-1])
    assert before - after > BLOCK * BLOCKS // 1024 // 2
