"""``membot sessions``: list, show, export (archived parts included) and delete, as a subprocess."""

from __future__ import annotations

import asyncio
import json
import stat
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.domain import Message, Role, Session, ToolCall
from bot.memory.archive import TranscriptArchive
from bot.sessions import JsonSessionStore
from tests.bot.cli.membot_process import run_membot

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def membot(tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(tmp_path), "MEMBOT_WORKSPACE": str(tmp_path / "ws"), "COLUMNS": "80"}
    return run_membot(*args, env=env, stdin=stdin, cwd=tmp_path)


def message(role: Role, text: str, minutes: int) -> Message:
    return Message(role=role, content=text, timestamp=T0 + timedelta(minutes=minutes))


async def _store(workspace: Path, session: Session, archived: list[Message]) -> None:
    if archived:
        await TranscriptArchive(workspace / "memory" / "archive").append(session.id, archived, T0)
    await JsonSessionStore(workspace / "sessions").save(session)


def store(workspace: Path, session: Session, archived: Sequence[Message] = ()) -> None:
    asyncio.run(_store(workspace, session, list(archived)))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """Two sessions: a Telegram chat with an archived start, and an older terminal chat."""
    ws = tmp_path / "ws"
    old = [message(Role.USER, "my cat is called Miso", 0), message(Role.ASSISTANT, "Noted: Miso.", 1)]
    telegram = Session.new("telegram", "777")
    kept = message(Role.ASSISTANT, "summary: the cat is Miso", 2)
    telegram.messages = [kept, message(Role.USER, "what is my cat called?", 3)]
    telegram.messages.append(message(Role.ASSISTANT, "Miso.", 4))
    telegram.updated_at = T0 + timedelta(days=2)
    store(ws, telegram, [*old, kept])  # `kept` is archived and still active: exported once
    cli = Session.new("cli", "alice")
    cli.messages = [message(Role.USER, "hello", 0), message(Role.ASSISTANT, "hi", 1)]
    cli.updated_at = T0 + timedelta(days=1)
    store(ws, cli)
    return ws


def test_list_shows_counts_sizes_and_activity_newest_first(tmp_path: Path, workspace: Path) -> None:
    result = membot(tmp_path, "sessions", "list")
    assert result.returncode == 0, result.stderr
    rows = [
        line.strip() for line in result.stdout.splitlines() if line.strip().startswith(("telegram:", "cli:"))
    ]
    assert [r.split()[0] for r in rows] == ["telegram:777", "cli:alice"]
    assert rows[0].split()[1:3] == ["3", "3"]  # 3 active, 3 archived
    assert "2025-03-03 12:00" in rows[0] and "B" in rows[0]
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


# OSC 52 writes the operator's clipboard, CSI 2J clears the screen to fake what follows, BEL, C1 CSI, a
# bidi override that shows what follows backwards (and an emoji whose zero-width joiner must stay).
HOSTILE = (
    "see \x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x1b[8mhidden\x9b31m\rdone \u202eexe.txt \U0001f469\u200d\U0001f4bb"
)


def test_show_prints_what_others_wrote_without_obeying_its_control_characters(tmp_path: Path) -> None:
    """A group member's words, a fetched page (a tool result) and the model's tool call reached the
    operator's terminal raw: ESC sequences were obeyed (the chat on the terminal and pairing names
    were already shown, not obeyed)."""
    session = Session.new("telegram", "-100")
    session.messages = [
        message(Role.USER, f"Mallory: {HOSTILE}", 0),
        Message(Role.ASSISTANT, "", tool_calls=(ToolCall("c1", "web_fetch", f'{{"url": "{HOSTILE}"}}'),)),
        Message(Role.TOOL, f"page text {HOSTILE}", tool_call_id="c1", name="web_fetch"),
        message(Role.ASSISTANT, f"The page says {HOSTILE}", 2),
    ]
    store(tmp_path / "ws", session)
    result = membot(tmp_path, "sessions", "show", "telegram:-100")
    assert result.returncode == 0, result.stderr
    for obeyed in ("\x1b", "\x07", "\x9b", "\r", "\u202e"):
        assert obeyed not in result.stdout
    assert result.stdout.count("see ␛]52;c;cm0gLXJmIH4=␇␛[2J␛[8mhidden�31mdone \ufffdexe.txt") == 4
    assert result.stdout.count("\U0001f469\u200d\U0001f4bb") == 4  # (a line may wrap before it)
    assert "Mallory: see" in result.stdout and "→ web_fetch(" in result.stdout


def test_markdown_export_to_stdout_does_not_obey_control_characters(tmp_path: Path) -> None:
    """``sessions export --format markdown`` without ``--output`` printed the transcript raw: a page the
    model fetched could write the operator's clipboard (OSC 52) or clear the screen, as ``show`` could."""
    session = Session.new("telegram", "-100")
    session.messages = [
        message(Role.USER, f"Mallory: {HOSTILE}", 0),
        Message(Role.TOOL, f"page text {HOSTILE}", tool_call_id="c1", name="web_fetch"),
    ]
    store(tmp_path / "ws", session)
    result = membot(tmp_path, "sessions", "export", "telegram:-100", "--format", "markdown")
    assert result.returncode == 0, result.stderr
    for obeyed in ("\x1b", "\x07", "\x9b", "\r", "\u202e"):
        assert obeyed not in result.stdout
    assert result.stdout.count("see ␛]52;c;cm0gLXJmIH4=␇␛[2J␛[8mhidden�31mdone \ufffdexe.txt") == 2


def test_json_export_to_stdout_escapes_what_json_leaves_raw(tmp_path: Path) -> None:
    """JSON escapes the C0 controls, but with ``ensure_ascii=False`` a C1 control (U+009B: CSI to many
    terminals) and the bidi controls reached the operator's terminal raw. They are ``\\u`` escapes now:
    the same JSON to a parser, nothing for a terminal to obey."""
    session = Session.new("telegram", "-100")
    session.messages = [message(Role.USER, f"Mallory: {HOSTILE}", 0)]
    store(tmp_path / "ws", session)
    result = membot(tmp_path, "sessions", "export", "telegram:-100")
    assert result.returncode == 0, result.stderr
    for obeyed in ("\x1b", "\x07", "\x9b", "\r", "\u202e"):
        assert obeyed not in result.stdout
    [said] = [m["content"] for m in json.loads(result.stdout)["messages"]]
    assert said == f"Mallory: {HOSTILE}"  # word for word, once parsed


def test_list_of_an_empty_workspace(tmp_path: Path) -> None:
    result = membot(tmp_path, "sessions", "list")
    assert result.returncode == 0 and "No sessions" in result.stdout


def test_show_by_unique_prefix(tmp_path: Path, workspace: Path) -> None:
    result = membot(tmp_path, "sessions", "show", "tele", "--last", "1")
    assert result.returncode == 0, result.stderr
    assert "telegram:777" in result.stdout and "3 active, 3 archived" in result.stdout
    assert "Miso." in result.stdout and "what is my cat called?" not in result.stdout


def test_export_json_has_the_full_transcript_in_order(tmp_path: Path, workspace: Path) -> None:
    result = membot(tmp_path, "sessions", "export", "telegram:777")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["id"] == "telegram:777"
    assert [(m["content"], m["archived"]) for m in data["messages"]] == [
        ("my cat is called Miso", True),
        ("Noted: Miso.", True),
        ("summary: the cat is Miso", True),
        ("what is my cat called?", False),
        ("Miso.", False),
    ]


def test_export_markdown_to_a_private_file(tmp_path: Path, workspace: Path) -> None:
    target = tmp_path / "out" / "chat.md"
    result = membot(tmp_path, "sessions", "export", "telegram:777", "--format", "markdown", "-o", str(target))
    assert result.returncode == 0, result.stderr
    text = target.read_text()
    assert text.startswith("# Session telegram:777")
    assert text.index("## Archived messages") < text.index("my cat is called Miso")
    assert text.index("## Active conversation") < text.index("what is my cat called?")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o1777, 0o755])
def test_export_leaves_the_folder_as_it_was(tmp_path: Path, workspace: Path, mode: int) -> None:
    """The export is private, the folder is the operator's: an export to /tmp (1777) made /tmp 0700, its
    sticky bit and every other user's access gone, as if it were a workspace folder."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    target = shared / "chat.json"
    target.write_text("an older export\n")
    target.chmod(0o644)
    result = membot(tmp_path, "sessions", "export", "telegram:777", "-o", str(target))
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(shared.stat().st_mode) == mode
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert json.loads(target.read_text())["id"] == "telegram:777"
    assert sorted(p.name for p in shared.iterdir()) == ["chat.json"]  # no temp file left beside it


def test_delete_asks_first_and_then_removes_the_files(tmp_path: Path, workspace: Path) -> None:
    kept = membot(tmp_path, "sessions", "delete", "cli:alice", stdin="n\n")
    assert kept.returncode == 1 and (workspace / "sessions" / "cli:alice.json").exists()

    gone = membot(tmp_path, "sessions", "delete", "cli:alice", "--yes")
    assert gone.returncode == 0, gone.stderr
    assert not list((workspace / "sessions").glob("cli:alice.*"))
    assert (workspace / "sessions" / "telegram:777.json").exists()
    assert "cli:alice" not in membot(tmp_path, "sessions", "list").stdout
    # An empty id ("$SID" unset) names no session, even where only one is left to match it.
    unset = membot(tmp_path, "sessions", "delete", "", "--yes")
    assert unset.returncode == 2 and "give a session id" in unset.stderr
    assert (workspace / "sessions" / "telegram:777.json").exists()


def test_unknown_and_ambiguous_ids_are_clear_errors(tmp_path: Path, workspace: Path) -> None:
    missing = membot(tmp_path, "sessions", "show", "discord:1")
    assert missing.returncode == 2 and "no session 'discord:1'" in missing.stderr
    bracketed = membot(tmp_path, "sessions", "show", "[/x]")  # not read as markup (was a MarkupError)
    assert bracketed.returncode == 2 and "no session '[/x]'" in bracketed.stderr
    store(workspace, Session.new("telegram", "778"))
    ambiguous = membot(tmp_path, "sessions", "export", "telegram:77")
    assert ambiguous.returncode == 2 and "matches 2 sessions" in ambiguous.stderr
    assert "Traceback" not in missing.stderr + ambiguous.stderr


def test_many_sessions_still_list_cleanly(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    for n in range(60):  # above the progress-bar threshold; the bar goes to stderr only
        session = Session.new("discord", f"chan-{n:02d}")
        session.messages = [message(Role.USER, "x", n)]
        store(ws, session)
    result = membot(tmp_path, "sessions", "list")
    assert result.returncode == 0, result.stderr
    assert "60 sessions" in result.stdout
    assert sum(line.strip().startswith("discord:") for line in result.stdout.splitlines()) == 60


def test_list_names_the_session_files_it_cannot_read(tmp_path: Path, workspace: Path) -> None:
    """A header naming a log that is missing (copied apart from it while the bot ran) used to leave its
    session out of the list without a word, as if the chat had never been."""
    header = workspace / "sessions" / "telegram:777.json"
    header.write_text(json.dumps({**json.loads(header.read_text()), "log_generation": 9}))
    result = membot(tmp_path, "sessions", "list")
    assert result.returncode == 0, result.stderr
    assert "1 sessions in" in result.stdout and "cli:alice" in result.stdout
    said = " ".join(result.stdout.split())
    assert "1 session files could not be read: telegram:777.json" in said
