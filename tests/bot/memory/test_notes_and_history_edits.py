"""Daily notes and HISTORY.md as operators keep them, while the bot appends to them.

Saved in place (truncated, then rewritten: nano, VS Code, vim with ``backupcopy=yes``):
the editor's descriptor has no ``O_APPEND``: it writes at its own offset, so a line the bot appended
between the truncation and the editor's last write was written over by the rest of the operator's
text, and what of it stuck out past that text stayed behind as a fragment glued to the file's end. The
bot now waits while another program has the file open for writing, and appends once the save is done.
Proven with a real editor process that stops halfway through its save.

Linked elsewhere (a dotfiles folder) before the file there exists: made where the link points.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from bot.domain import Message, Role
from bot.memory import Exchange, MemoryService
from tests.bot.memory.conftest import Clock, make_memory

# Truncate the file, write the first half of the buffer, say so, wait to be told, write the rest.
EDITOR = r"""
import sys
path, text = sys.argv[1], sys.argv[2]
half = len(text) // 2
with open(path, "w") as f:
    f.write(text[:half])
    f.flush()
    print("half", flush=True)
    sys.stdin.readline()
    f.write(text[half:])
"""

OPERATOR = "".join(f"[08:{n:02d}] operator's own line {n}\n" for n in range(10))


async def saved_in_place_while(path: Path, text: str, bot_write: Callable[[], Awaitable[object]]) -> None:
    """A real editor saves ``text`` into ``path`` in place; ``bot_write`` runs halfway through."""
    editor = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        EDITOR,
        str(path),
        text,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert editor.stdin is not None and editor.stdout is not None
    assert await editor.stdout.readline() == b"half\n"
    write = asyncio.ensure_future(bot_write())
    # The old code appended at once; the bot now waits for the save to end, which is the editor's
    # next step (the wait's bound only lets the old code's append land first).
    await asyncio.wait({write}, timeout=0.5)
    editor.stdin.write(b"go\n")
    await editor.stdin.drain()
    assert await editor.wait() == 0
    await write


async def test_a_note_line_appended_during_an_in_place_save_is_kept_whole(
    memory: MemoryService, clock: Clock
) -> None:
    note = memory.root / "2024-05-20.md"
    note.write_text(OPERATOR)
    said = Message(Role.USER, "the bot's own turn", timestamp=clock.now)
    answer = Message(Role.ASSISTANT, "answered while the operator saved", timestamp=clock.now)

    await saved_in_place_while(
        note,
        OPERATOR + "[08:59] operator's new line\n",
        lambda: memory.record_exchanges([Exchange("cli:me", said, answer)]),
    )

    lines = note.read_text().splitlines()
    assert lines[:11] == [*OPERATOR.splitlines(), "[08:59] operator's new line"]
    assert lines[11:] == ["[09:30] User: the bot's own turn | Assistant: answered while the operator saved"]


async def test_a_history_entry_appended_during_an_in_place_save_is_kept_whole(memory: MemoryService) -> None:
    history = memory.history.main_path
    history.write_text("## operator's notes\n\n" + OPERATOR)
    text = "## operator's notes\n\n" + OPERATOR + "a line the operator added\n"
    when = datetime(2024, 5, 20, 9, 30, tzinfo=UTC)

    await saved_in_place_while(history, text, lambda: memory.history.append(when, "cli:me", "We talked."))

    assert history.read_text() == text + "## 2024-05-20T09:30:00+00:00 — cli:me\n\nWe talked.\n\n"


async def test_history_md_linked_to_a_file_not_made_yet_is_made_where_the_link_points(
    memory: MemoryService, tmp_path: Path
) -> None:
    """``ln -s ~/dotfiles/membot-history.md memory/HISTORY.md`` before that file exists: every append
    failed (FileNotFoundError: the link exists, so the create-if-missing open refused it, and the open
    of an existing file found none), and consolidations stalled on it for good."""
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    history = memory.history.main_path
    history.symlink_to(dotfiles / "membot-history.md")
    when = datetime(2024, 5, 20, 9, 30, tzinfo=UTC)

    await memory.history.append(when, "cli:me", "We talked.")

    assert history.is_symlink()
    assert (
        dotfiles / "membot-history.md"
    ).read_text() == "## 2024-05-20T09:30:00+00:00 — cli:me\n\nWe talked.\n\n"


async def test_a_history_md_the_bot_cannot_write_is_named_in_the_log_with_the_fix(
    tmp_path: Path, clock: Clock
) -> None:
    """HISTORY.md linked into a folder that is gone (a dotfiles folder moved, a share not mounted): the
    background consolidation's failure was logged as ``FileNotFoundError(2, 'No such file or
    directory')``, naming no file and no fix, and it fails again at every retirement."""
    memory = await make_memory(tmp_path, clock)  # no model: the raw-fallback entry is the write
    gone = tmp_path / "unmounted" / "HISTORY.md"
    memory.history.main_path.symlink_to(gone)
    said = [Message(Role.USER, "hello there", timestamp=clock.now)]

    with capture_logs() as logs:
        task = await memory.consolidate_in_background("cli:me", said)
        assert task is not None
        with pytest.raises(FileNotFoundError):
            await task

    [crashed] = [e for e in logs if e["event"] == "consolidation_crashed"]
    assert str(gone) in crashed["error"] and "permissions" in crashed["hint"]
    await memory.close()


async def test_a_resumed_entry_looked_for_during_an_in_place_save_is_not_written_twice(
    memory: MemoryService,
) -> None:
    """A consolidation resumed at start-up looks for its entry before appending it (a kill may have
    come after the append): looked for in the half the editor had rewritten, it was not found, and was
    appended a second time once the save was done."""
    history = memory.history.main_path
    when = datetime(2024, 5, 20, 9, 30, tzinfo=UTC)
    entry = "## 2024-05-20T09:30:00+00:00 — cli:me\n\nWe talked.\n\n"
    text = OPERATOR + entry + OPERATOR.replace("08:", "10:")
    history.write_text(text)

    await saved_in_place_while(
        history, text, lambda: memory.history.append(when, "cli:me", "We talked.", once=True)
    )

    assert history.read_text() == text


async def test_a_replayed_note_line_looked_for_during_an_in_place_save_is_not_written_twice(
    memory: MemoryService, clock: Clock
) -> None:
    """A replay (an import run again, the start's recovery after a power cut) skips the note lines the
    file holds: looked for in the half the editor had rewritten, a line was not found and was appended
    a second time once the save was done."""
    note = memory.root / "2024-05-20.md"
    said = Message(Role.USER, "the bot's own turn", timestamp=clock.now)
    answer = Message(Role.ASSISTANT, "recorded before", timestamp=clock.now)
    line = "[09:30] User: the bot's own turn | Assistant: recorded before\n"
    text = OPERATOR + line + OPERATOR.replace("08:", "10:")
    note.write_text(text)

    await saved_in_place_while(
        note, text, lambda: memory.record_exchanges([Exchange("cli:me", said, answer)], replay=True)
    )

    assert note.read_text() == text
