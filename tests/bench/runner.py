"""Running a bench script as its user would: a fresh process from the project root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python bench/<script> ARGS``, output captured; ``MEMBOT_*`` settings of the environment left out,
    so a developer's own configuration cannot change what the bench does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBOT_")}
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
        check=False,
    )
