"""Run ``python -m bot`` as an operator would: a real subprocess with a clean ``MEMBOT_*`` environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_membot(
    *args: str, env: dict[str, str] | None = None, stdin: str = "", cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``membot ARGS`` with this environment minus any ``MEMBOT_*`` (and ``VISUAL``) plus ``env``."""
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
    )
