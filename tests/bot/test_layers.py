"""Layers point one way: the core (``bot``, ``pipeline``) never imports the channel adapters.

Only the composition root, ``bot/app.py``, builds channels; everything else talks to them through
``bot.ports.ChannelPort``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPOSITION_ROOT = ROOT / "bot" / "app.py"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_only_the_composition_root_imports_channels() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in _imported_modules(path) if m.split(".")[0] == "channels"
        )
        for package in ("bot", "pipeline")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != COMPOSITION_ROOT
    }
    assert {path: mods for path, mods in offenders.items() if mods} == {}
