"""Every third-party package that bot/, pipeline/ and channels/ import is declared in pyproject.toml.

An undeclared import works only while something else happens to pull the package in (``yarl`` came
with aiohttp), and breaks the day that changes. Imports are read with ``ast`` (also those inside
functions and ``TYPE_CHECKING`` blocks); each top-level module is mapped to the distribution that
provides it through the installed metadata, and that must be a declared dependency or extra.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("bot", "pipeline", "channels")
FIRST_PARTY = set(SOURCES)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    return {_normalize(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in requirements}


def imported() -> dict[str, set[str]]:
    """Top-level third-party module -> the files importing it."""
    found: dict[str, set[str]] = {}
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in FIRST_PARTY or top == "__future__":
                        continue
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_declared() -> None:
    providers = packages_distributions()
    wanted = declared()
    missing: dict[str, list[str]] = {}
    for module, files in sorted(imported().items()):
        distributions = {_normalize(d) for d in providers.get(module, [module])}
        if not distributions & wanted:
            missing[f"{module} (from {', '.join(sorted(distributions))})"] = sorted(files)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
