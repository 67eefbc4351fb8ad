"""``membot memory`` as an operator uses it: import, search, stats, show."""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from tests.bot.cli.membot_process import run_membot


def membot(
    *args: str, workspace: Path, editor: str = "", timezone: str = ""
) -> subprocess.CompletedProcess[str]:
    env = {"MEMBOT_WORKSPACE": str(workspace), "HOME": str(workspace.parent), "COLUMNS": "100"}
    if timezone:
        env["MEMBOT_TIMEZONE"] = timezone
    if editor:
        env["EDITOR"] = editor
    return run_membot(*args, env=env)


def test_search_shows_the_day_in_the_configured_time_zone(tmp_path: Path) -> None:
    # 20:00 UTC on January 1st is the morning of January 2nd in Tokyo, the daily note's day.
    export = tmp_path / "conv.json"
    turns = [
        {"role": "user", "content": "I love green tea from Kyoto"},
        {"role": "assistant", "content": "Ok"},
    ]
    export.write_text(
        json.dumps({"sessions": [{"id": "s1", "date": "2024-01-01T20:00:00Z", "turns": turns}]})
    )
    ws = tmp_path / "ws"
    assert membot("memory", "import", str(export), workspace=ws, timezone="Asia/Tokyo").returncode == 0
    assert (ws / "memory" / "2024-01-02.md").exists()
    found = membot("memory", "search", "green tea", workspace=ws, timezone="Asia/Tokyo")
    assert found.returncode == 0 and "2024-01-02" in found.stdout and "2024-01-01" not in found.stdout


def test_import_then_search_stats_and_show(tmp_path: Path) -> None:
    export = tmp_path / "conv.json"
    export.write_text(
        json.dumps(
            {
                "sessions": [
                    {
                        "id": "s1",
                        "date": "2024-01-01 10:00",
                        "turns": [
                            {"role": "user", "content": "I love green tea from Kyoto"},
                            {"role": "assistant", "content": "Noted, green tea it is."},
                        ],
                    },
                    {
                        "id": "s2",
                        "date": "2024-02-01 09:00",
                        "turns": [
                            {"role": "user", "content": "My dog is called Biscuit"},
                            {"role": "assistant", "content": "Hi Biscuit!"},
                        ],
                    },
                ]
            }
        )
    )
    ws = tmp_path / "ws"
    imported = membot("memory", "import", str(export), workspace=ws)
    assert imported.returncode == 0, imported.stderr
    assert "imported 2 sessions, 4 turns" in imported.stdout
    again = membot("memory", "import", str(export), workspace=ws)  # safe to run again: nothing new
    assert "imported 2 sessions, 4 turns, 0 memory items" in again.stdout, again.stdout

    found = membot("memory", "search", "which tea do I like", "-k", "3", workspace=ws)
    assert found.returncode == 0 and "green tea from Kyoto" in found.stdout
    negative = membot("memory", "search", "which tea do I like", "-k", "-3", workspace=ws)
    assert negative.returncode == 2 and "greater than or equal to 1" in negative.stderr

    stats = membot("memory", "stats", workspace=ws)
    assert stats.returncode == 0 and "episodic items" in stats.stdout

    shown = membot("memory", "show", "--query", "what is my dog called", workspace=ws)
    assert shown.returncode == 0
    assert "# Memory" in shown.stdout and "Biscuit" in shown.stdout
    assert oct((ws / "memory").stat().st_mode & 0o777) == "0o700"


def test_import_of_a_missing_or_bad_file_is_a_clear_error(tmp_path: Path) -> None:
    missing = membot("memory", "import", str(tmp_path / "nope.json"), workspace=tmp_path / "ws")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"sessions": 5}')
    result = membot("memory", "import", str(bad), workspace=tmp_path / "ws")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    bad.write_text('{"sessions": [{"id": "s1", "date": "2024-05-01", "turns": ["hello"]}]}')
    result = membot("memory", "import", str(bad), workspace=tmp_path / "ws")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "session 's1', turn 0: a turn must be an object" in result.stderr
    folder = membot("memory", "import", str(tmp_path), workspace=tmp_path / "ws")
    assert folder.returncode == 2 and "is a folder" in folder.stderr
    # A pipe exists (`membot memory import <(zcat export.json.gz)`): it said "/dev/fd/63 does not exist".
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    piped = membot("memory", "import", str(pipe), workspace=tmp_path / "ws")
    assert piped.returncode == 2 and "does not exist" not in piped.stderr, piped.stderr
    assert "is not a regular file: save the export to a file and import that" in piped.stderr


def test_edit_saves_a_memory_md_the_operator_made_read_only_and_leaves_it_read_only(tmp_path: Path) -> None:
    """The operator's own save goes in (the bot's do not: bot/memory/longterm.py); the file was left
    0600, writable by the bot again."""
    editor = tmp_path / "editor.py"
    editor.write_text(
        "import sys\npath = sys.argv[1]\nold = open(path).read()\n"
        "open(path, 'w').write(old + '- The user is allergic to peanuts.\\n')\n"
    )
    ws = tmp_path / "ws"
    memory_md = ws / "memory" / "MEMORY.md"
    memory_md.parent.mkdir(parents=True)
    memory_md.write_text("- likes tea\n")
    memory_md.chmod(0o444)

    edited = membot("memory", "edit", workspace=ws, editor=f"{sys.executable} {editor}")

    assert edited.returncode == 0, edited.stderr
    assert memory_md.read_text() == "- likes tea\n- The user is allergic to peanuts.\n"
    assert oct(memory_md.stat().st_mode & 0o777) == "0o400"


def test_edit_opens_the_editor_on_memory_md_and_keeps_it_private(tmp_path: Path) -> None:
    # An "editor" that saves the way many do: write a new file, rename it over the old one.
    editor = tmp_path / "editor.py"
    editor.write_text(
        "import os, sys\n"
        "path = sys.argv[1]\n"
        "old = open(path).read()\n"
        "with open(path + '.new', 'w') as f:\n"
        "    f.write(old + '- The user is allergic to peanuts.\\n')\n"
        "os.chmod(path + '.new', 0o644)\n"
        "os.replace(path + '.new', path)\n"
    )
    ws = tmp_path / "ws"
    env_editor = f"{sys.executable} {editor}"
    edited = membot("memory", "edit", workspace=ws, editor=env_editor)
    assert edited.returncode == 0, edited.stderr

    memory_md = ws / "memory" / "MEMORY.md"
    assert "allergic to peanuts" in memory_md.read_text()
    assert oct(memory_md.stat().st_mode & 0o777) == "0o600"
    shown = membot("memory", "show", workspace=ws)
    assert "## Long-term Memory" in shown.stdout and "allergic to peanuts" in shown.stdout


def test_an_edit_that_empties_memory_md_says_where_its_lines_went(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "MEMORY.md").write_text("- The user is allergic to peanuts.\n")
    emptier = tmp_path / "emptier.py"
    emptier.write_text("import sys\nopen(sys.argv[1], 'w').close()\n")
    edited = membot("memory", "edit", workspace=ws, editor=f"{sys.executable} {emptier}")
    assert edited.returncode == 0, edited.stderr
    assert "MEMORY.replaced.md" in edited.stdout
    assert "allergic to peanuts" in (ws / "memory" / "MEMORY.replaced.md").read_text()


def test_edit_with_a_missing_editor_says_how_to_fix_it(tmp_path: Path) -> None:
    result = membot("memory", "edit", workspace=tmp_path / "ws", editor="no-such-editor-here")
    assert result.returncode == 2
    assert "set $EDITOR" in result.stderr and "Traceback" not in result.stderr


def test_brackets_in_memories_are_printed_as_written(tmp_path: Path) -> None:
    """Printed as rich markup, "[/quote]" from a chat crashed the command and "[docs]" vanished."""
    export = tmp_path / "conv.json"
    turns = [
        {"role": "user", "content": "see the [docs](http://example.com) for the backup schedule"},
        {"role": "user", "content": "he wrote: old backup notes[/quote] and left [bold]"},
    ]
    export.write_text(json.dumps({"sessions": [{"id": "s1", "date": "2024-01-01 10:00", "turns": turns}]}))
    ws = tmp_path / "ws"
    assert membot("memory", "import", str(export), workspace=ws).returncode == 0

    found = membot("memory", "search", "backup schedule notes", workspace=ws)

    assert found.returncode == 0, found.stderr
    assert "see the [docs](http://example.com)" in found.stdout and "notes[/quote]" in found.stdout


def test_edit_of_a_memory_md_in_another_encoding_says_how_to_convert_it(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    memory_md = ws / "memory" / "MEMORY.md"
    memory_md.parent.mkdir(parents=True)
    memory_md.write_bytes("- Crème brûlée\n".encode("latin-1"))
    editor = tmp_path / "editor.py"
    editor.write_text("raise SystemExit('the editor must not be opened')\n")

    result = membot("memory", "edit", workspace=ws, editor=f"{sys.executable} {editor}")

    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "is not UTF-8 text" in result.stderr and "iconv -f latin1 -t utf-8" in result.stderr
    assert memory_md.read_bytes() == "- Crème brûlée\n".encode("latin-1")


def test_edit_of_a_memory_md_past_what_membot_reads_is_not_opened(tmp_path: Path) -> None:
    """8 MB pasted into MEMORY.md (sparse: no disk): read whole and copied for the editor, a multi-GB
    one would end the command; it is left alone, and the message says how to shorten it."""
    ws = tmp_path / "ws"
    memory_md = ws / "memory" / "MEMORY.md"
    memory_md.parent.mkdir(parents=True)
    memory_md.write_text("- likes tea\n")
    os.truncate(memory_md, 8 << 20)
    before = memory_md.stat().st_mtime_ns
    editor = tmp_path / "editor.py"
    editor.write_text("raise SystemExit('the editor must not be opened')\n")

    result = membot("memory", "edit", workspace=ws, editor=f"{sys.executable} {editor}")

    assert result.returncode == 2 and "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    assert "holds more than membot reads" in message and "shorten it in another editor" in message
    assert memory_md.stat().st_size == 8 << 20 and memory_md.stat().st_mtime_ns == before


def test_an_edit_past_what_membot_reads_is_not_saved(tmp_path: Path) -> None:
    """The operator pastes 8 MB in the editor: MEMORY.md is not made larger than the bot reads back."""
    ws = tmp_path / "ws"
    memory_md = ws / "memory" / "MEMORY.md"
    memory_md.parent.mkdir(parents=True)
    memory_md.write_text("- likes tea\n")
    editor = tmp_path / "editor.py"
    editor.write_text("import os, sys\nos.truncate(sys.argv[1], 8 << 20)\n")
    temp = tmp_path / "tmp"
    temp.mkdir()

    result = run_membot(
        "memory",
        "edit",
        env={
            "MEMBOT_WORKSPACE": str(ws),
            "HOME": str(tmp_path),
            "TMPDIR": str(temp),
            "EDITOR": f"{sys.executable} {editor}",
        },
    )

    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert memory_md.read_text() == "- likes tea\n"
    [copy] = temp.glob("membot-edit-*/MEMORY.md")
    assert copy.stat().st_size == 8 << 20
    message = " ".join(result.stderr.split())
    assert "more than membot reads" in message and str(copy) in message


def test_an_item_with_a_naive_timestamp_does_not_break_retrieval(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "memory" / "items").mkdir(parents=True)
    base = {"layer": "semantic", "type": "fact", "references": [], "tags": []}
    items = [
        # Written by hand (or an older tool): timestamps without a zone.
        {**base, "id": "naive1", "title": "boat", "content": "User owns a red sailing boat",
         "created_at": "2024-03-01T10:00:00", "updated_at": "2024-03-01T10:00:00"},
        {**base, "id": "aware1", "title": "boat name", "content": "The sailing boat is named Gull",
         "created_at": "2024-03-02T10:00:00+00:00", "updated_at": "2024-03-02T10:00:00+00:00"},
    ]  # fmt: skip
    lines = "".join(json.dumps(i) + "\n" for i in items)
    (ws / "memory" / "items" / "semantic.jsonl").write_text(lines)
    found = membot("memory", "search", "sailing boat", workspace=ws)
    assert found.returncode == 0, found.stderr
    assert "red sailing boat" in found.stdout and "named Gull" in found.stdout


def test_an_edit_that_cannot_be_saved_says_where_the_operators_text_is(tmp_path: Path) -> None:
    """A full disk (here: a file size limit, which fails the write the same way) when the edit is put in
    place said only "error: File too large"; the text was kept, in a temporary folder nobody named."""
    ws = tmp_path / "ws"
    memory_md = ws / "memory" / "MEMORY.md"
    memory_md.parent.mkdir(parents=True)
    memory_md.write_text("# Facts\n- likes tea\n")
    typed = "".join(f"- operator fact {i}: typed with care for an hour\n" for i in range(200))
    editor = tmp_path / "editor.py"  # the editor itself may write files of any size
    editor.write_text(
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        f"open(sys.argv[1], 'a').write({typed!r})\n"
    )
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMBOT_") and k != "VISUAL"}
    env.update(
        MEMBOT_WORKSPACE=str(ws), HOME=str(tmp_path), TMPDIR=str(temp), EDITOR=f"{sys.executable} {editor}"
    )

    def small_files() -> None:  # membot's writes past 4 KiB fail with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))

    result = subprocess.run(
        [sys.executable, "-m", "bot", "memory", "edit"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=small_files,
    )

    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert memory_md.read_text() == "# Facts\n- likes tea\n"
    [copy] = temp.glob("membot-edit-*/MEMORY.md")
    assert copy.read_text() == "# Facts\n- likes tea\n" + typed
    assert str(copy) in " ".join(result.stderr.split()), result.stderr
    assert "MEMORY.md left as it was" in result.stderr


def test_import_of_a_truncated_or_damaged_gzip_export_is_a_clear_error(tmp_path: Path) -> None:
    """A .json.gz cut short (a copy that stopped, a full disk) printed only "Aborted."."""
    sessions = [
        {"id": f"s{i}", "date": "2024-01-01 10:00", "turns": [{"role": "user", "content": f"fact {i}"}]}
        for i in range(2000)
    ]
    whole = gzip.compress(json.dumps({"sessions": sessions}).encode())
    export = tmp_path / "conv.json.gz"
    export.write_bytes(whole[: len(whole) // 2])
    ws = tmp_path / "ws"

    result = membot("memory", "import", str(export), workspace=ws)

    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot read conversations from {export}" in " ".join(result.stderr.split())
    assert "ended before the end" in result.stderr
    assert not list((ws / "memory").glob("*.md")) and not list((ws / "memory").rglob("*.jsonl"))

    garbled = bytearray(whole)
    garbled[100:500] = bytes(400)  # in the deflate stream: zlib.error, not a CRC mismatch
    export.write_bytes(garbled)  # zlib's own error escaped as a traceback
    result = membot("memory", "import", str(export), workspace=ws)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot read conversations from {export}" in " ".join(result.stderr.split())
    assert not list((ws / "memory").glob("*.md")) and not list((ws / "memory").rglob("*.jsonl"))


def test_import_of_an_export_in_another_encoding_names_the_line_and_how_to_convert_it(
    tmp_path: Path,
) -> None:
    """A Latin-1 export said "'utf-8' codec can't decode byte 0xe9 in position 97": which line of a
    large file, and what to do, was left to the operator. A UTF-8 file that starts with a byte-order
    mark (Windows Notepad's UTF-8) was refused as not JSON."""
    turns = [{"role": "user", "content": "I love crème brûlée"}, {"role": "assistant", "content": "Noted."}]
    text = json.dumps(
        {"sessions": [{"id": "s1", "date": "2024-01-01 10:00", "turns": turns}]}, indent=1, ensure_ascii=False
    )
    export = tmp_path / "conv.json"
    export.write_bytes(text.encode("latin-1"))
    line, column = next(
        (n, row.index("è") + 1) for n, row in enumerate(text.splitlines(), start=1) if "crème" in row
    )
    ws = tmp_path / "ws"

    result = membot("memory", "import", str(export), workspace=ws)

    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "Traceback" not in said, said
    assert f"{export} is not UTF-8 text (line {line}, column {column} is not)" in said
    assert "iconv -f latin1 -t utf-8" in said
    assert not list((ws / "memory").glob("*.md")) and not list((ws / "memory").rglob("*.jsonl"))

    export.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    result = membot("memory", "import", str(export), workspace=ws)
    assert result.returncode == 0 and "imported 1 sessions, 2 turns" in result.stdout, result.stderr


def test_import_errors_name_the_session_turn_or_field_at_fault(tmp_path: Path) -> None:
    """A bad timestamp said only "cannot read the date 'yesterday'" (in which of thousands of sessions?),
    and LongMemEval lists of different lengths "zip() argument 2 is shorter than argument 1"."""
    ws, export = tmp_path / "ws", tmp_path / "conv.json"
    good = {"id": "s1", "date": "2024-01-01 10:00", "turns": [{"role": "user", "content": "kept?"}]}
    stamped = {"role": "user", "content": "x", "timestamp": "yesterday"}
    bad = {"id": "s7", "date": "2024-01-02 10:00", "turns": [{"role": "user", "content": "ok"}, stamped]}
    export.write_text(json.dumps({"sessions": [good, bad]}))
    result = membot("memory", "import", str(export), workspace=ws)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "session 's7', turn 1: cannot read the date 'yesterday'" in " ".join(result.stderr.split())

    lme = {
        "haystack_session_ids": ["a", "b"],
        "haystack_dates": ["2024/01/01 (Mon) 10:00"],
        "haystack_sessions": [[], []],
    }
    export.write_text(json.dumps([lme]))
    result = membot("memory", "import", str(export), workspace=ws)
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "Traceback" not in said
    assert "haystack_session_ids (2), haystack_dates (1) and haystack_sessions (2)" in said, said
    assert not list((ws / "memory").glob("*.md")) and not list((ws / "memory").rglob("*.jsonl"))


def test_show_and_search_print_memories_without_obeying_their_control_characters(tmp_path: Path) -> None:
    """MEMORY.md and the items hold what chats said and what the model wrote: printed raw, their ESC
    sequences (OSC 52 writes the clipboard, CSI 2J clears the screen) were obeyed by the terminal."""
    hostile = "green tea \x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x9b31m from \u202eotoyK"  # a bidi override too
    export = tmp_path / "conv.json"
    turns = [{"role": "user", "content": f"I love {hostile}"}, {"role": "assistant", "content": "Ok"}]
    export.write_text(json.dumps({"sessions": [{"id": "s1", "date": "2024-01-01 10:00", "turns": turns}]}))
    ws = tmp_path / "ws"
    assert membot("memory", "import", str(export), workspace=ws).returncode == 0
    (ws / "memory" / "MEMORY.md").write_text(f"- likes {hostile}\n")
    for args in (("memory", "search", "green tea"), ("memory", "show")):
        result = membot(*args, workspace=ws)
        assert result.returncode == 0, result.stderr
        assert "\x1b" not in result.stdout and "\x07" not in result.stdout and "\x9b" not in result.stdout
        assert "\u202e" not in result.stdout and "\ufffdotoyK" in result.stdout, args
        assert "␛]52;c;cm0gLXJmIH4=␇␛[2J" in result.stdout, args


def test_import_of_an_unknown_shape_says_which_shape_it_takes(tmp_path: Path) -> None:
    """It said "expected sessions with turns; see membot docs", and no doc shows the format: the
    operator could not make a file it takes. The error now shows one, and a missing date how to give it."""
    ws, export = tmp_path / "ws", tmp_path / "conv.json"
    export.write_text(json.dumps({"conversations": []}))
    result = membot("memory", "import", str(export), workspace=ws)
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "see membot docs" not in said, said
    example = '{"sessions": [{"id": "s1", "date": "2024-05-30 10:00", "turns": [{"role": "user", "content": "..."}]}]}'
    assert example in said, said
    sessions = json.loads(example.replace("...", "I keep bees"))
    export.write_text(json.dumps(sessions))  # what the error shows is a file it takes
    assert membot("memory", "import", str(export), workspace=ws).returncode == 0
    del sessions["sessions"][0]["date"]
    export.write_text(json.dumps(sessions))
    said = " ".join(membot("memory", "import", str(export), workspace=ws).stderr.split())
    assert """session 's1' has no date: give it one, e.g. "date": "2024-05-30 10:00\"""" in said, said
