"""The wheel test's slow set-up (a wheel build, a venv, a full dependency install), run in the background.

As soon as collection shows that a test of test_wheel_install.py will run (conftest.py), a thread builds
the wheel and installs it into a fresh venv outside the source tree while the rest of the suite runs; the
fixtures there only wait for the result. Nothing is skipped: the same build and install happen, earlier.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "models.json", "bot", "pipeline", "channels")


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def build_and_install(base: Path) -> tuple[Path, Path]:
    """(the wheel, a venv with it installed): built from a copy, so the tree is left as it was."""
    src = base / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name, follow_symlinks=False)  # symlinks kept as links
    out = base / "dist"
    run(sys.executable, "-m", "build", "--wheel", "--outdir", out, src, cwd=src)
    (wheel,) = out.glob("membot-*.whl")
    # No pip of its own (ensurepip costs ~10 s): this run's pip installs into it. No byte-compiling of
    # every dependency either (another ~10 s); what the tests import compiles as it is imported.
    venv = base / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=base)
    python = venv / "bin" / "python"
    run(
        sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-compile", wheel, cwd=base
    )
    return wheel, venv


class Prepared:
    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="membot-wheel-"))
        self.result: Future[tuple[Path, Path]] = Future()
        self._thread = threading.Thread(target=self._run, name="wheel-install", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result.set_result(build_and_install(self.base))
        except BaseException as exc:
            self.result.set_exception(exc)

    def close(self) -> None:
        self._thread.join(timeout=600)
        shutil.rmtree(self.base, ignore_errors=True)


_prepared: Prepared | None = None


def prepared() -> Future[tuple[Path, Path]]:
    """The background build's result (started now if collection did not start it)."""
    global _prepared
    if _prepared is None:
        _prepared = Prepared()
    return _prepared.result


def close() -> None:
    """Wait for a build still running, then remove what it made."""
    if _prepared is not None:
        _prepared.close()
