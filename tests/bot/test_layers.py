"""Layers point one way: the core (``bot``, ``pipeline``) never imports the channel adapters.

Only the composition root, ``bot/app.py``, builds channels; everything else talks to them through
``bot.ports.ChannelPort``. And a package that declares ``__all__`` is entered only through it: code
outside ``bot/memory/`` imports ``bot.memory``, never ``bot.memory.service``.
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


def _packages_with_all() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for package in ("bot", "pipeline", "channels"):
        for init in sorted((ROOT / package).rglob("__init__.py")):
            tree = ast.parse(init.read_text(encoding="utf-8"))
            for node in tree.body:
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
                ):
                    name = ".".join(init.parent.relative_to(ROOT).parts)
                    found[name] = set(ast.literal_eval(node.value))
    return found


def test_packages_are_entered_through_their_all() -> None:
    packages = _packages_with_all()
    core = {f"bot.{name}" for name in ("memory", "llm", "tools", "commands", "dispatcher")}
    assert core | {"pipeline", "channels"} <= set(packages)
    offenders: list[str] = []
    for top in ("bot", "pipeline", "channels"):
        for path in sorted((ROOT / top).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
                    continue
                # The innermost package the import reaches into (channels.telegram, not channels).
                reached = [p for p in packages if node.module == p or node.module.startswith(p + ".")]
                if not reached:
                    continue
                package = max(reached, key=len)
                if module == package or module.startswith(package + "."):
                    continue  # a package's own modules import each other directly
                if node.module != package:
                    offenders.append(f"{module}: from {node.module} import ...")
                else:
                    offenders += [f"{module}: {a.name} not in {package}.__all__"
                                  for a in node.names if a.name not in packages[package]]  # fmt: skip
    assert offenders == []
