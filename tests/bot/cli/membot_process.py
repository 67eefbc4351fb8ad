"""Run ``python -m bot`` as an operator would: a real subprocess with a clean ``MEMBOT_*`` environment."""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys
from pathlib import Path

from tests.fakes.llm_server import FakeLLMServer


def run_membot(
    *args: str,
    env: dict[str, str] | None = None,
    stdin: str = "",
    cwd: Path | None = None,
    max_file_bytes: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """``membot ARGS`` with this environment minus any ``MEMBOT_*`` (and ``VISUAL``) plus ``env``.

    ``max_file_bytes`` makes every write past that size of a file fail (EFBIG, RLIMIT_FSIZE; Python
    ignores SIGXFSZ): a real write failure, as on a full disk, that holds as root too."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMBOT_") and k != "VISUAL"}
    clean.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "bot", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=clean,
        cwd=cwd,
        timeout=60,
        preexec_fn=None if max_file_bytes is None else lambda: limit_files(max_file_bytes),
    )


def limit_files(size: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


async def wait_in_flight(llm: FakeLLMServer) -> None:
    """Until the model server is answering a request (the answer is being written)."""
    async with asyncio.timeout(30):
        while llm.in_flight == 0:
            await asyncio.sleep(0.02)
