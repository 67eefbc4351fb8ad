"""Every `membot ...` command the READMEs name is a real command, with real options.

An operator types what the README says; a renamed or never-written subcommand (`membot memory status`
for `stats`) answers "No such command" at the moment they needed it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.core import TyperGroup

from bot.cli import app

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", ROOT / "deploy" / "README.md"]

for _module in ("core", "doctor", "memory", "pairing", "sessions"):  # they register on `app`, as main() does
    importlib.import_module(f"bot.cli.{_module}")


def documented() -> list[tuple[str, str]]:
    """(file, command) for each `membot ...` in backticks, as written."""
    found = []
    for doc in DOCS:
        for text in re.findall(r"`(membot [^`]+)`", doc.read_text(encoding="utf-8")):
            found.append((doc.name, text.split("<")[0].strip()))  # (`membot chat < questions.txt`)
    return found


def problems(text: str) -> list[str]:
    """What in ``text`` the command line does not have: a command, or an option of one. Alternatives
    (`membot sessions list|show`, `membot memory show | edit`) are each checked."""
    if " | " in text:
        first, *others = text.split(" | ")
        prefix = first.split()[:-1] if " " in first.strip() else []
        if prefix == ["membot"]:  # a shell pipe (`membot chat | tee chat.txt`), not subcommands
            return problems(first)
        return [p for alt in [first, *(" ".join([*prefix, o]) for o in others)] for p in problems(alt)]
    words = text.split()
    for i, word in enumerate(words):
        if "|" in word:
            return [p for alt in word.split("|") for p in problems(" ".join([*words[:i], alt]))]
    command: Any = typer.main.get_command(app)  # (typer's own copy of click's classes)
    words = words[1:]
    while isinstance(command, TyperGroup) and words and not words[0].startswith("-"):
        sub = command.get_command(typer.Context(command), words[0])
        if sub is None:
            return [f"no command {words[0]!r} in `{text}`"]
        command, words = sub, words[1:]
    known = {opt for param in command.params for opt in getattr(param, "opts", [])}
    wanted = [w.strip("[]") for w in words if w.strip("[]").startswith("-")]
    return [f"no option {w} in `{text}`" for w in wanted if w not in known and w != "--help"]


@pytest.mark.parametrize(("doc", "text"), documented())
def test_each_documented_command_exists(doc: str, text: str) -> None:
    assert not problems(text), f"{doc}: {problems(text)}"


def test_the_check_catches_what_is_not_there() -> None:
    assert problems("membot memory status")
    assert problems("membot sessions list|show|nope")
    assert problems("membot doctor [--online]")
    assert not problems("membot memory show | edit | search QUERY | stats | import FILE | reindex")
    assert not problems("membot chat | tee chat.txt") and problems("membot chats | tee chat.txt")
