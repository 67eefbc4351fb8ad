"""``membot sessions``: list, show, export and delete conversations on disk.

Reads the workspace directly, so it works while membot is stopped (and read-only commands while it
runs). ``export`` writes the full transcript: the archived messages that compaction or ``/new`` took
out of the active session (memory/archive/, see bot/memory/archive.py) followed by the active ones.
``delete`` removes the session files; the archive and memory items are kept, since memory may still
refer to them. Stop the service before deleting, or it may write a session it holds in memory again.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from bot.cli.root import app, command_group, console, err_console, fail, settings_from
from bot.domain import Message, Session
from bot.printable import json_escaped, printable
from bot.storage import atomic_write_at, ensure_private_dir
from bot.surrogates import utf8
from bot.workspace_lock import WorkspaceLock

if TYPE_CHECKING:
    from bot.config import Settings
    from bot.memory import TranscriptArchive

sessions_app = command_group("List, show, export and delete stored conversations.")
app.add_typer(sessions_app, name="sessions")

T = TypeVar("T")
_PROGRESS_FROM = 50  # show a progress bar when reading at least this many files


class ExportFormat(StrEnum):
    json = "json"
    markdown = "markdown"


@dataclass(frozen=True, slots=True)
class _Summary:
    id: str
    messages: int
    archived: int
    size: int
    last_activity: datetime | None


# ---- commands --------------------------------------------------------------------------------------


@sessions_app.command("list")
def list_sessions(ctx: typer.Context) -> None:
    """Every session with its message count, size on disk and last activity (newest first)."""
    settings = settings_from(ctx)
    headers = sorted(settings.sessions_dir.glob("*.json")) if settings.sessions_dir.is_dir() else []
    if not headers:
        console.print(f"No sessions in {settings.sessions_dir}.")
        return
    rows: list[_Summary] = []
    unread: list[str] = []
    for path in _progress(headers, "Reading sessions"):
        summary = _summarize(path, settings)
        if summary is None:
            unread.append(path.name)
        else:
            rows.append(summary)
    rows.sort(key=lambda s: s.last_activity.timestamp() if s.last_activity else 0.0, reverse=True)
    table = Table(
        box=box.SIMPLE_HEAD, pad_edge=False, title=f"{len(rows)} sessions in {settings.sessions_dir}"
    )
    table.add_column("session", overflow="fold", ratio=1)
    table.add_column("messages", justify="right", no_wrap=True)
    table.add_column("archived", justify="right", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("last activity (UTC)", no_wrap=True)
    for s in rows:
        table.add_row(
            printable(s.id), str(s.messages), str(s.archived), _size(s.size), _when(s.last_activity)
        )
    console.print(table)
    if unread:  # a damaged file, or one a copy of a running bot took apart from its log: never hidden
        names = ", ".join(printable(name) for name in unread)
        console.print(
            f"{len(unread)} session files could not be read: {names}. The bot repairs each one (or sets"
            " it aside as *.corrupt-*) when it next loads that chat; `membot sessions show ID` says why."
        )


@sessions_app.command()
def show(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(help="Session id (or a unique prefix), e.g. telegram:12345.")],
    last: Annotated[int, typer.Option(help="How many of the latest messages to print (0: none).")] = 10,
) -> None:
    """A session's details and its latest messages."""
    settings = settings_from(ctx)
    loaded = _load(settings, _resolve(settings, session))
    archived = asyncio.run(_archive(settings).read(loaded.id))
    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    usage = loaded.usage
    for key, value in (
        ("session", loaded.id),
        ("state", loaded.state.value),
        ("created", _when(loaded.created_at)),
        ("last activity", _when(loaded.updated_at)),
        ("messages", f"{len(loaded.messages)} active, {len(archived)} archived"),
        ("compactions", str(loaded.compactions)),
        ("tokens", f"{usage.input_tokens} in / {usage.output_tokens} out ({usage.calls} calls)"),
        ("cost", f"${usage.cost_usd:.4f}"),
        ("metadata", json.dumps(loaded.metadata, ensure_ascii=False) if loaded.metadata else "-"),
    ):
        table.add_row(key, printable(value))
    console.print(table)
    for message in loaded.messages[-last:] if last > 0 else []:
        text = message.content if len(message.content) <= 500 else message.content[:500] + " …"
        heading = Text.assemble((message.role.value, "bold"), " ", (_when(message.timestamp), "dim"))
        console.print(heading, highlight=False)
        # What chat members, fetched pages and the model wrote: shown, never obeyed by the terminal.
        console.print(printable(text or _calls(message)), highlight=False, markup=False)
        console.print()


@sessions_app.command()
def export(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(help="Session id (or a unique prefix).")],
    format: Annotated[
        ExportFormat, typer.Option("--format", "-f", help="json or markdown.")
    ] = ExportFormat.json,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file (0600) instead of stdout.")
    ] = None,
) -> None:
    """The full transcript, archived parts included, as JSON or Markdown."""
    settings = settings_from(ctx)
    loaded = _load(settings, _resolve(settings, session))
    archived = asyncio.run(_archive(settings).read(loaded.id))
    archived_ids = {m.id for m in archived}
    active = [m for m in loaded.messages if m.id not in archived_ids]  # archived but still active: once
    if format is ExportFormat.json:
        text = _as_json(loaded, archived, active)
    else:
        text = _as_markdown(loaded, archived, active)
    if output is None:
        # What chat members, fetched pages and the model wrote, on the operator's terminal: shown, never
        # obeyed (JSON as \\u escapes, which parse to the same text; Markdown as visible symbols). A
        # Markdown file stays word for word.
        console.out(text if format is ExportFormat.json else printable(text), highlight=False)
        return
    try:
        _write_export(output.expanduser(), text)
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror}")
    err_console.print(f"Wrote {len(archived) + len(active)} messages of {loaded.id} to {output}.")


@sessions_app.command()
def delete(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(help="Session id (or a unique prefix).")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete a session's files (stop membot first). The transcript archive and memory are kept."""
    from bot.sessions import JsonSessionStore

    settings = settings_from(ctx)
    sid = _resolve(settings, session)
    if not yes and not typer.confirm(f"Delete session {sid}? This cannot be undone.", default=False):
        raise typer.Exit(1)
    with WorkspaceLock.hold(settings.workspace):  # a running bot would save the session right back
        removed = asyncio.run(JsonSessionStore(settings.sessions_dir).delete(sid))
    if not removed:
        fail(f"session {sid} was already gone")
    console.print(
        f"Deleted session {sid}. Its archived transcript (if any) stays in {_archive_dir(settings)}."
    )


# ---- reading ---------------------------------------------------------------------------------------


def _archive_dir(settings: Settings) -> Path:
    return settings.memory_dir / "archive"


def _archive(settings: Settings) -> TranscriptArchive:
    from bot.memory import TranscriptArchive  # the memory layer owns the archive format

    return TranscriptArchive(_archive_dir(settings))


def _summarize(header_path: Path, settings: Settings) -> _Summary | None:
    """Counts from the header and what was appended since the log was last rewritten."""
    from bot.session_names import encode_id, glob_escape
    from bot.sessions import JsonSessionStore

    peek = JsonSessionStore(settings.sessions_dir).peek(header_path)
    if peek is None:
        return None
    sid = peek.id
    name = encode_id(sid)
    size = sum(
        _file_size(p)
        for p in header_path.parent.glob(f"{glob_escape(name)}.*")
        if ".corrupt-" not in p.name and ".damaged-" not in p.name  # set aside: not the session's
    )
    archive = _archive(settings).path_for(sid)
    archived = 0
    if archive.is_file():
        size += _file_size(archive)
        with archive.open("rb") as f:
            archived = sum(1 for line in f if line.strip())
    return _Summary(sid, peek.messages, archived, size, peek.updated_at)


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _resolve(settings: Settings, given: str) -> str:
    """An exact session id, or the one session whose id starts with ``given`` (never an empty prefix:
    ``delete "$SID"`` with the variable unset must not pick the only session there is)."""
    from bot.sessions import JsonSessionStore

    if not given.strip():
        fail("give a session id (see `membot sessions list`)")
    store = JsonSessionStore(settings.sessions_dir)
    if store.header_path(given).is_file():
        return given
    ids = asyncio.run(store.list_ids())
    matches = [sid for sid in ids if sid.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        fail(f"no session {given!r} in {settings.sessions_dir} (see `membot sessions list`)")
    fail(f"{given!r} matches {len(matches)} sessions: {', '.join(matches[:5])}… — give more of the id")


def _load(settings: Settings, sid: str) -> Session:
    from bot.sessions import JsonSessionStore

    # Read-only: this runs beside the bot, which owns the files (and repairs them when it loads them).
    loaded = asyncio.run(JsonSessionStore(settings.sessions_dir, read_only=True).load(sid))
    if loaded is None:
        fail(f"no session {sid} in {settings.sessions_dir} (see `membot sessions list`)")
    return loaded


def _progress(items: Sequence[T], label: str, *, threshold: int = _PROGRESS_FROM) -> Iterable[T]:
    """``items``, with a progress bar on stderr when there are many (stdout stays clean for pipes)."""
    from rich.progress import track

    if len(items) < threshold:
        return items
    return track(items, description=label, console=err_console, transient=True)


# ---- rendering -------------------------------------------------------------------------------------


def _as_json(session: Session, archived: list[Message], active: list[Message]) -> str:
    data: dict[str, Any] = {
        **session.summary(),
        "messages": [{**m.to_dict(), "archived": True} for m in archived]
        + [{**m.to_dict(), "archived": False} for m in active],
    }
    return json_escaped(json.dumps(data, ensure_ascii=False, indent=2)) + "\n"


def _as_markdown(session: Session, archived: list[Message], active: list[Message]) -> str:
    lines = [
        f"# Session {session.id}",
        "",
        f"- channel: {session.channel}, chat: {session.chat_id}",
        f"- created: {_when(session.created_at)} UTC, last activity: {_when(session.updated_at)} UTC",
        f"- messages: {len(archived)} archived, {len(active)} active",
        "",
    ]
    for title, messages in (("Archived messages", archived), ("Active conversation", active)):
        if not messages:
            continue
        lines += [f"## {title}", ""]
        for m in _progress(messages, f"Rendering {title.lower()}", threshold=5000):
            who = m.role.value + (f" ({m.name})" if m.name else "")
            lines += [f"### {who} · {_when(m.timestamp)}", ""]
            if m.content:
                lines += [m.content, ""]
            if m.tool_calls:
                lines += ["```", _calls(m), "```", ""]
    return "\n".join(lines)


def _calls(message: Message) -> str:
    return "\n".join(f"→ {c.name}({c.arguments})" for c in message.tool_calls)


def _when(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M") if moment else "-"


def _size(count: int) -> str:
    size = float(count)
    for unit in ("B", "KB", "MB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


# ---- writing ---------------------------------------------------------------------------------------


def _write_export(path: Path, text: str) -> None:
    """``text`` as ``path``, 0600 and whole (a temp file renamed over it), in a folder the operator chose:
    one made here is private (0700), one that exists keeps its mode. (``atomic_write_text`` makes its
    folder 0700, as the workspace's are: an export to /tmp took /tmp's sticky bit and every other user's
    access to it.)"""
    folder = path.parent
    if not folder.exists():
        ensure_private_dir(folder)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        atomic_write_at(fd, path.name, utf8(text))
    finally:
        os.close(fd)
