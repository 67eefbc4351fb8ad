"""The results of a turn's tool calls, kept on disk until the turn is over, so a rerun does not redo them.

A turn cut by a kill (or a power cut, or a shutdown's grace running out) is answered again after the
restart from the start: the model is asked anew and, given the same conversation, asks for the same
tools. Without a record, the calls that had run ran again: an ``append`` wrote its line twice, a shell
command ran twice. With it, a call already made in this turn (the same tool, the same arguments, the
same how-many-th such call) is answered with the result it had, and only new calls run.

One file per chat in ``state/tool_calls/``, named as its session's files are: a first line naming the
turn (its first message's platform id) and one line per result, each appended and fsynced before the
model reads it. A file naming another turn is stale (that turn ended) and is removed when the chat's
next turn makes its first call; until then it holds what the session's log holds too. A torn last line
(a kill mid-append) is ignored, as in every log of the workspace. A turn is known by its first
message's id (the platform's; the terminal makes one per message): a message without one is not
recorded, and its turn runs its calls again.

    journal = ToolJournal.of(settings.state_dir)
    made = await journal.made("telegram:42", "9001")           # {(name, arguments, n): result}
    await journal.keep("telegram:42", "9001", ("files", '{"action": "append"}', 1), "Appended.")
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Collection
from pathlib import Path

import structlog

from bot.session_names import encode_id
from bot.storage import append_bytes

log = structlog.get_logger(__name__)

CallKey = tuple[str, str, int]
"""A call within a turn: its tool's name, its arguments (JSON, keys sorted) and how many such calls
the turn had made with it (1 for the first)."""


class ToolJournal:
    """Results of the tool calls of each chat's current turn (blocking I/O runs in a thread)."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder

    @classmethod
    def of(cls, state_dir: Path) -> ToolJournal:
        """The workspace's journal, in its state folder."""
        return cls(state_dir / "tool_calls")

    def path_for(self, session_id: str) -> Path:
        return self._folder / f"{encode_id(session_id)}.jsonl"

    async def made(self, session_id: str, turn_key: str) -> dict[CallKey, str]:
        """The calls this turn already made (none the first time), dropping a stale record of an
        earlier turn of the chat."""
        return await asyncio.to_thread(self._made, session_id, turn_key)

    async def keep(self, session_id: str, turn_key: str, call: CallKey, result: str) -> None:
        """Record ``call``'s result durably (the first one also names the turn)."""
        await asyncio.to_thread(self._keep, session_id, turn_key, call, result)

    async def move(self, old: str, new: str, *, waiting: Collection[str]) -> bool:
        """Chat ``old``'s record made ``new``'s (a Telegram group's move, bot/session_moves.py, at the
        start): one rename, so a repeat finds nothing to move. A record of ``new`` naming a turn that
        ended (none of ``waiting``, the ids of its pending messages) is replaced: it is stale (the next
        turn's first call drops it, see :meth:`made`), and left, it kept the group's record from moving,
        so the group's cut turn ran its calls again. False when ``new``'s turn was cut too: both are left."""
        return await asyncio.to_thread(self._move, old, new, waiting)

    def _move(self, old: str, new: str, waiting: Collection[str]) -> bool:
        before, after = self.path_for(old), self.path_for(new)
        if not before.exists():
            return True
        try:
            lines = [line for line in after.read_bytes().split(b"\n") if line.strip()]
        except FileNotFoundError:
            lines = []
        if lines and _parsed(lines[0]).get("turn") in waiting:
            return False
        os.replace(before, after)
        return True

    def _made(self, session_id: str, turn_key: str) -> dict[CallKey, str]:
        path = self.path_for(session_id)
        try:
            lines = path.read_bytes().split(b"\n")
        except FileNotFoundError:
            return {}
        records = [_parsed(line) for line in lines if line.strip()]
        if not records or records[0].get("turn") != turn_key:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # an earlier turn's, over (a lost unlink leaves it stale, nothing more)
            return {}
        made: dict[CallKey, str] = {}
        for record in records[1:]:  # (calls made at once may each have written a header: skipped here)
            name, arguments, n, result = (record.get(k) for k in ("name", "arguments", "n", "result"))
            if (
                isinstance(name, str)
                and isinstance(arguments, str)
                and isinstance(n, int)
                and isinstance(result, str)
            ):
                made[(name, arguments, n)] = result
        if made:
            log.info("tool_calls_from_an_earlier_run", session_id=session_id, calls=len(made))
        return made

    def _keep(self, session_id: str, turn_key: str, call: CallKey, result: str) -> None:
        path = self.path_for(session_id)
        name, arguments, n = call
        # Named in its first line: a file left empty by a first append that failed (a full disk) is named
        # too, or every later record of the turn would go in unnamed and a rerun would take them for an
        # earlier turn's (and run the calls again).
        try:
            named = path.stat().st_size > 0
        except FileNotFoundError:
            named = False
        lines: list[dict[str, str | int]] = [] if named else [{"turn": turn_key}]
        lines.append({"name": name, "arguments": arguments, "n": n, "result": result})
        data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
        append_bytes(path, data.encode("utf-8"), whole_lines=True)


def _parsed(line: bytes) -> dict[str, object]:
    try:
        value = json.loads(line)
    except ValueError:  # a torn last line
        return {}
    return value if isinstance(value, dict) else {}
