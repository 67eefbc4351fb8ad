"""``membot memory``: see, edit, search, measure and import what membot remembers."""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from zoneinfo import ZoneInfo

import typer
from rich.table import Table

from bot.cli.memory_access import open_service, run_finding, run_on_memory
from bot.cli.root import (
    EXIT_CONFIG,
    EXIT_UNAVAILABLE,
    app,
    command_group,
    console,
    err_console,
    fail,
    settings_from,
)
from bot.errors import ConfigError
from bot.printable import printable

if TYPE_CHECKING:
    from bot.memory import MemoryService, ScoredItem

memory_app = command_group("See, edit, search and import what membot remembers.")
app.add_typer(memory_app, name="memory")


@memory_app.command()
def show(
    ctx: typer.Context,
    session: Annotated[
        str | None, typer.Option(help="Session id, e.g. telegram:123 (default: none).")
    ] = None,
    query: Annotated[str | None, typer.Option(help="Pretend the user just said this.")] = None,
) -> None:
    """Print the system prompt the model would see next, memory included (found as the bot finds it, by
    its words and by its meaning, as `search` does). Reads only: safe beside a running bot."""
    from bot.errors import StorageError
    from bot.memory import operator as ops
    from bot.sessions import JsonSessionStore

    settings = settings_from(ctx)

    async def work(service: MemoryService) -> str:
        history = []
        if session:
            # Read-only, as `membot sessions show`: the bot owns the session's files and repairs them.
            try:
                loaded = await JsonSessionStore(settings.sessions_dir, read_only=True).load(session)
            except StorageError as exc:
                fail(str(exc))
            if loaded is None:
                fail(f"no session {session!r} (see `membot sessions list`)")
            history = loaded.messages
        return await ops.render_for_session(
            service, settings.system_prompt, history, query, session_id=session or ""
        )

    prompt, note = run_finding(settings, work, session_id=session or "")
    if note:
        err_console.print(f"({note})")
    console.print(printable(prompt), markup=False, highlight=False, soft_wrap=True)


@memory_app.command()
def edit(ctx: typer.Context) -> None:
    """Edit MEMORY.md in $EDITOR; a running bot sees the change on the next message.

    You edit a copy, saved when the editor exits; what the bot wrote meanwhile is merged in. A file more
    than the bot reads is not opened: shorten it in another editor (the bot does not write it meanwhile).
    """
    from bot.memory import Conflict, Limits, LongTermMemory, MemoryFull, NotUtf8

    settings = settings_from(ctx)
    path = run_on_memory(settings, lambda service: _path(service))
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    memory = LongTermMemory(path, limits=Limits.of(settings.memory))
    # Read-only (``chmod a-w``): the operator froze it against the bot's writes, not their own; it stays so.
    frozen = path.exists() and not path.stat().st_mode & stat.S_IWUSR
    try:
        start = _read_capped(path, memory.read_cap) if path.exists() else ""
    except _TooLarge:
        fail(
            f"{path} holds more than membot reads ({memory.read_cap} bytes), so it is not opened here: "
            "shorten it in another editor (the bot does not write it meanwhile), or raise "
            "memory.max_memory_hard_size"
        )
    except UnicodeDecodeError as exc:
        fail(
            f"{path} is not UTF-8 text (byte {exc.start} is not): convert it first, e.g. "
            f"`iconv -f latin1 -t utf-8 {shlex.quote(str(path))}` into a new file you then move over it"
        )
    folder = Path(tempfile.mkdtemp(prefix="membot-edit-"))  # 0700, ours alone
    copy = folder / path.name
    copy.write_text(start, encoding="utf-8")
    copy.chmod(0o600)
    try:
        code = subprocess.call([*shlex.split(editor), str(copy)])
    except (OSError, ValueError) as exc:
        shutil.rmtree(folder, ignore_errors=True)
        fail(f"cannot start the editor {editor!r} ({exc}); set $EDITOR to one that is installed")
    try:
        edited = _read_capped(copy, memory.read_cap) if copy.exists() else start
    except _TooLarge:
        fail(
            f"your text is more than membot reads ({memory.read_cap} bytes): MEMORY.md left as it was; "
            f"your text is in {copy}"
        )
    except UnicodeDecodeError:
        fail(f"the editor saved {copy} in another encoding than UTF-8: MEMORY.md left as it was")
    if code != 0:
        if edited != start:
            console.print(f"the editor exited with {code}: MEMORY.md left as it was; your text is in {copy}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
        raise typer.Exit(code)
    if edited == start:
        shutil.rmtree(folder, ignore_errors=True)
        console.print("no change")
        return
    try:
        merged = memory.apply_operator_edit(start, edited)
    except NotUtf8:  # saved in another encoding by something else while you edited
        fail(f"{path} is no longer UTF-8 text: MEMORY.md left as it was; your text is in {copy}")
    except MemoryFull:  # another program made MEMORY.md that large while you edited, or the merge would
        fail(
            f"cannot save {path}: it would hold more than membot reads ({memory.read_cap} bytes) with the "
            f"bot's change merged in, or it does already: MEMORY.md left as it was; your text is in {copy}"
        )
    except (OSError, Conflict) as exc:  # a full disk, say: the copy is all the operator has
        reason = exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)
        fail(
            f"cannot save {path} ({reason}): MEMORY.md left as it was; your text is in {copy}. "
            "Fix the cause, then copy it over MEMORY.md (or paste it into `membot memory edit`)"
        )
    shutil.rmtree(folder, ignore_errors=True)
    path.chmod(0o400 if frozen else 0o600)
    if merged:
        console.print("saved; the bot had changed MEMORY.md meanwhile and its change was merged into yours")
    elif start.strip() and not edited.strip():  # emptied: say where the lines are, in case it was a slip
        where = path.with_name("MEMORY.replaced.md")  # unwrapped, so the path can be copied whole
        console.print(f"saved an empty MEMORY.md; the lines it held are in {where}", soft_wrap=True)
    else:
        console.print("saved")


class _TooLarge(Exception):
    pass


def _read_capped(path: Path, cap: int) -> str:
    """The file's UTF-8 text (:class:`UnicodeDecodeError` if it is not); :class:`_TooLarge` past ``cap``
    bytes, of which no more than one more is read (a multi-GB MEMORY.md read whole ended the process)."""
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise _TooLarge
    return data.decode("utf-8")


async def _path(service: MemoryService) -> Path:
    from bot.memory import operator as ops

    return ops.memory_file(service)


@memory_app.command()
def search(
    ctx: typer.Context,
    query: Annotated[str, typer.Argument(help="What to look for: words, or what they mean.")],
    k: Annotated[int, typer.Option("-k", min=1, max=100, help="How many results (1-100).")] = 10,
    session: Annotated[
        str | None,
        typer.Option(help='Search as this chat would (memory.scope = "chat"); default: every chat.'),
    ] = None,
) -> None:
    """Search structured memory as the bot does: by its words (BM25 over lemmas) and by its meaning
    (memory.embeddings' model, over the vectors the bot made). Items the bot has not embedded yet are
    found by their words only, and counted. Reads only: safe beside a running bot."""
    from bot.memory import operator as ops

    settings = settings_from(ctx)

    async def work(service: MemoryService) -> list[ScoredItem]:
        return await ops.search(service, query, k=k, session_id=session)

    found, note = run_finding(settings, work, session_id=session)
    if note:
        err_console.print(f"({note})")
    if not found:
        console.print("nothing found")
        return
    table = Table("score", "layer", "type", "when", "content")
    zone = ZoneInfo(settings.memory_timezone)  # the day of the daily note it is in
    for hit in found:
        item = hit.item
        text = printable(" ".join(item.content.split()))
        table.add_row(
            f"{hit.score:.2f}",
            item.layer,
            item.type,
            f"{item.created_at.astimezone(zone):%Y-%m-%d}",
            text[:200],
            end_section=False,
        )
    console.print(table)


@memory_app.command()
def stats(
    ctx: typer.Context,
    session: Annotated[
        str | None,
        typer.Option(help='One chat\'s MEMORY.md, notes and items (memory.scope = "chat").'),
    ] = None,
) -> None:
    """Sizes, item counts per layer, and the last consolidation. Reads only: safe beside a running bot."""
    from bot.memory import operator as ops

    figures = run_on_memory(settings_from(ctx), lambda service: ops.stats(service, session_id=session))
    table = Table("what", "value", show_header=False)
    table.add_row("MEMORY.md", f"{figures.memory_md_bytes:,} bytes")
    table.add_row("HISTORY.md", f"{figures.history_bytes:,} bytes")
    table.add_row("today's notes", str(figures.today_notes))
    for layer, count in figures.items.items():
        table.add_row(f"{layer} items", str(count))
    table.add_row("archived sessions", str(figures.archived_sessions))
    last = figures.last_consolidation or "never"
    if figures.last_consolidation_fallback:
        last += " (raw fallback)"
    table.add_row("last consolidation", last)
    table.add_row("pending consolidations", str(figures.pending_consolidations))
    console.print(table)


@memory_app.command("import")
def import_(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="JSON (or .json.gz) with sessions of timestamped turns.")],
) -> None:
    """Replay past conversations through the normal memory write path; safe to run again."""
    if not file.is_file():
        if file.is_dir():
            fail(f"{file} is a folder: name the export file in it")
        # A pipe (`<(zcat export.json.gz)`) or a device exists: "does not exist" was untrue.
        fail(
            f"{file} is not a regular file: save the export to a file and import that"
            if file.exists()
            else f"{file} does not exist"
        )
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from bot.memory import operator as ops
    from bot.workspace_lock import WorkspaceLock

    settings = settings_from(ctx)
    columns = (TextColumn("importing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("import", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        # (The lock's own errors are the workspace's, not the export's: 78 or 75, from main.)
        with WorkspaceLock.hold(settings.workspace):  # the bot appends to the same item files
            try:
                report = run_on_memory(
                    settings,
                    lambda service: ops.import_conversations(service, file, progress=advance),
                    read_only=False,
                )
            except (ValueError, KeyError, TypeError) as exc:
                fail(f"{file} is not a conversation export this command understands ({exc})")
            except ConfigError as exc:  # the importer's: the export is wrong (it names where), not a setting
                fail(str(exc))
    console.print(f"imported {report.sessions} sessions, {report.turns} turns, {report.items} memory items")


@memory_app.command()
def reindex(
    ctx: typer.Context,
    full: Annotated[
        bool, typer.Option("--full", help="Forget this model's vectors first and embed every item again.")
    ] = False,
) -> None:
    """Embed the memory items with the configured embedding model (after changing the model).

    What the bot embeds is embedded (what users said and the facts, not the answers); items that
    already have a vector are skipped, so a stopped run resumes. Safe next to a running bot.
    """
    import httpx
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from bot.memory import VECTORS_DIR, VectorStore, build_embedder
    from bot.memory import operator as ops

    settings = settings_from(ctx)
    if settings.memory.embeddings == "none":
        fail(
            'memory.embeddings is "none": set it to "local" (or "openai") to use semantic retrieval',
            EXIT_CONFIG,
        )
    columns = (TextColumn("embedding"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())

    async def main() -> tuple[VectorStore, int, int]:
        async with httpx.AsyncClient() as http:
            embedder = build_embedder(settings.memory, http)
            assert embedder is not None
            async with open_service(settings, read_only=True) as service:
                items = ops.items_to_embed(service)
            store = VectorStore(settings.memory_dir / VECTORS_DIR, embedder)
            await store.start()
            try:
                if full:
                    await store.reset()
                await store.compact({i.fingerprint for i in items})
                queued = store.submit(items)
                with Progress(*columns, console=console, transient=True) as progress:
                    task = progress.add_task("embed", total=queued)
                    left = await store.drain(lambda done, total: progress.update(task, completed=done))
            finally:
                await store.close(timeout=0)
            return store, queued, left

    store, queued, left = asyncio.run(main())
    if left:
        fail(
            f"embedding failed ({store.last_error}); {left} of {queued} items still have no vector. "
            "Fix the cause and run `membot memory reindex` again: finished items are kept.",
            EXIT_UNAVAILABLE,
        )
    console.print(
        f"embedded {queued} items with {store.model_id}; {store.count} vectors in {store.path}",
        highlight=False,
    )
