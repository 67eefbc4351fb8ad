"""Which parts of the workspace the model's tools may touch: its own files, never the bot's state.

The workspace holds two kinds of things side by side: what the model keeps (notes, drafts, lists) and
what the bot keeps (conversations, the inbox, who is allowed in, usage, caches, locks). A tool that
could write ``pairing.json`` could admit a stranger, so the bot's state is refused to every tool, and
not by listing what exists today: at the workspace root

- the names in :data:`BOT_STATE_NAMES` (``sessions/``, ``inbox/``, ``outbox/``, ``state/``, ``cache/``,
  ``pairing.json``, ``usage.json``, ...),
- every hidden name (``.env``, ``.membot.lock``, the temp files of atomic writes, ...),
- every name ending in one of :data:`BOT_STATE_SUFFIXES` (``.json``, ``.lock``, ``.pid``, ...), and
- the copies of any of these the bot sets aside when it finds one damaged (``<name>.damaged-<hash>``,
  ``<name>.corrupt-<time>``)

belong to the bot, whether they exist yet or not; so do the memory service's own records in
``memory/`` (:data:`BOT_STATE_PATHS`: the archive and the pending retirements hold every chat's
messages, items and vectors are its stores; and every hidden name there, its locks and markers) and
whatever the caller adds (``memory`` altogether in chat scope). A new state file of the bot therefore
needs a hidden name, one of those suffixes or an entry in :data:`BOT_STATE_NAMES` (in ``memory/``:
in :data:`BOT_STATE_PATHS`); ``tests/bot/cli/test_bot_state_process.py`` checks that everything a
real bot leaves at the root is refused. The model keeps its own files in folders or as plain text
files at the root (``notes/todo.md``, ``ideas.txt``).

``memory/`` is read-only except ``memory/MEMORY.md``, which the files tool writes through the memory
service's compare-and-swap.

Names are compared without case: on a case-folding filesystem (macOS, Windows shares) ``Sessions/``
*is* ``sessions/`` and ``Memory/MEMORY.md`` is ``memory/MEMORY.md``, and ``Path.resolve`` keeps the case
it was given. Elsewhere this refuses a few names the bot does not use, which costs the model nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Collection, Iterable
from pathlib import Path, PurePosixPath

from bot.storage import DIR_MODE
from bot.tools.base import ToolError

BOT_STATE_NAMES = frozenset(
    {"sessions", "inbox", "outbox", "state", "cache", "locks", "logs", "pairing.json", "usage.json"}
    | {"usage.json.journal"}
)
BOT_STATE_SUFFIXES = (".json", ".jsonl", ".lock", ".pid", ".tmp", ".db", ".sqlite", ".sock")
BOT_STATE_PATHS = ("memory/archive", "memory/pending", "memory/items", "memory/vectors")
MEMORY_DIR = "memory"
READ_ONLY = (MEMORY_DIR,)
MEMORY_FILE = PurePosixPath("memory/MEMORY.md")
PATH_MAX = 4096  # bytes, with the final NUL: Linux's limit on a path handed to the system
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 3072  # leaves a workspace path of up to 1,000 bytes or so room in front, within PATH_MAX
_STATE_PREFIXES = tuple(PurePosixPath(p) for p in BOT_STATE_PATHS)
_SET_ASIDE = re.compile(r"\.(damaged|corrupt)-[^/]*$", re.IGNORECASE)


def relative_path(raw: str) -> PurePosixPath:
    """Validate a model-supplied path without touching the disk: relative, no ``..``, no NUL."""
    if "\x00" in raw:
        raise ToolError("the path contains a NUL character")
    text = raw.strip() or "."
    if text.startswith(("/", "~", "\\")) or PurePosixPath(text).is_absolute():
        raise ToolError(f"absolute paths are not allowed ({raw!r}); give a path relative to the workspace")
    path = PurePosixPath(text)
    if ".." in path.parts:
        raise ToolError(f"'..' is not allowed in paths ({raw!r}); stay inside the workspace")
    # The filesystem's own limits (255 bytes a name, 4,096 a path), said plainly instead of an OSError;
    # in bytes, as the system counts them (1,023 characters of emoji are 4,092 bytes).
    if _size(text) > MAX_PATH_BYTES or any(_size(p) > MAX_NAME_BYTES for p in path.parts):
        raise ToolError(
            f"the path is too long ({_size(text)} bytes); use names of at most {MAX_NAME_BYTES} bytes and "
            f"paths of at most {MAX_PATH_BYTES} bytes"
        )
    return path


def _size(text: str) -> int:
    """``text``'s length in bytes as UTF-8 (a lone surrogate counted as the three bytes it would take)."""
    return len(text.encode("utf-8", "surrogatepass"))


def inside_workspace(root: Path, files: Iterable[Path | None]) -> list[str]:
    """Those of ``files`` that lie in ``root``, relative to it: the operator's configuration kept in the
    workspace (the TOML file, ``models_file``, ``.env``), which holds the tokens and the allowlists and
    so is the bot's to read, never a tool's. Blocking (it resolves links): call it off the loop."""
    real = root.resolve()
    found: list[str] = []
    for file in files:
        if file is not None and (path := file.expanduser().resolve()).is_relative_to(real) and path != real:
            found.append(path.relative_to(real).as_posix())
    return found


def bot_owned_name(name: str) -> bool:
    """True for a workspace-root entry the bot keeps (whether it exists yet or not), and for the copies
    of one it sets aside when it finds it damaged (``usage.json.journal.damaged-<hash>``,
    ``usage.json.corrupt-<time>``: bot/damaged.py, bot/usage.py)."""
    base = _SET_ASIDE.sub("", name).casefold()
    return base in BOT_STATE_NAMES or name.startswith(".") or base.endswith(BOT_STATE_SUFFIXES)


def bot_writes(rel: PurePosixPath) -> bool:
    """True for a file (``rel``, relative to the workspace) the bot itself must write to go on: its
    state (see the module doc), but not a hidden name at the root (``.env`` is the operator's, and
    read only). The start gives these their owner's write permission back
    (``bot.storage.fix_private_tree``): a workspace restored or copied read-only (0444 files) left
    the inbox, the sessions and memory's records unwritable by a bot that is not root."""
    parts = rel.parts
    if not parts or parts[0].startswith("."):
        return False
    return bot_owned_name(parts[0]) or _memory_state(rel)


def _memory_state(rel: PurePosixPath) -> bool:
    """The memory service's own records in ``memory/``: :data:`BOT_STATE_PATHS`, and every hidden name
    there (its locks and markers, ``.MEMORY.md.lock``: a tool holding that lock would stall its writes)."""
    parts = rel.parts
    hidden_in_memory = parts[0].casefold() == MEMORY_DIR and any(p.startswith(".") for p in parts[1:])
    return hidden_in_memory or under(rel, _STATE_PREFIXES)


def under(path: PurePosixPath, prefixes: Collection[PurePosixPath]) -> bool:
    """True when ``path`` is, or lies inside, one of ``prefixes`` (compared without case)."""
    parts = folded(path).parts
    return any(parts[: len(p.parts)] == folded(p).parts for p in prefixes)


def folded(path: PurePosixPath) -> PurePosixPath:
    """``path`` with every name case-folded: how a case-folding filesystem tells names apart."""
    return PurePosixPath(path.as_posix().casefold())


def is_memory_file(rel: PurePosixPath) -> bool:
    """True for ``memory/MEMORY.md`` in any case (the one file of ``memory/`` a tool may write)."""
    return folded(rel) == folded(MEMORY_FILE)


class Confinement:
    """The rules of one workspace: where a relative path really leads, and whether a tool may use it.

    ``protected`` adds prefixes (relative to the workspace) to the bot's state, which is always
    protected; ``read_only`` prefixes may be read but not written.
    """

    def __init__(
        self, root: Path, *, protected: Collection[str] = (), read_only: Collection[str] = READ_ONLY
    ) -> None:
        self.root = root
        self._protected = [PurePosixPath(p) for p in (*BOT_STATE_PATHS, *protected)]
        self._read_only = [PurePosixPath(p) for p in read_only]

    @property
    def protected_prefixes(self) -> list[PurePosixPath]:
        """The protected paths below the top level (``memory/archive``, ...); hidden names in ``memory/``
        are protected too, which the shell's entry-by-entry view of ``memory/`` relies on."""
        return list(self._protected)

    def protected(self, rel: PurePosixPath) -> bool:
        """True when ``rel`` is, or lies inside, something the bot keeps."""
        if not rel.parts:
            return False
        return bot_owned_name(rel.parts[0]) or _memory_state(rel) or under(rel, self._protected)

    def read_only(self, rel: PurePosixPath) -> bool:
        return under(rel, self._read_only)

    def locate(self, rel: PurePosixPath) -> Path:
        """The real path of ``rel`` inside the workspace, or a ToolError saying why not.

        Both the path as given and the path its symbolic links lead to must stay inside the workspace
        and out of the bot's state, so a link cannot reach ``sessions/`` or anything outside.
        """
        root = self.root.resolve()
        real = _joined(root, rel)
        if real != root and not real.is_relative_to(root):
            raise ToolError(f"{rel} leads outside the workspace through a symbolic link; refused")
        inner = PurePosixPath(real.relative_to(root).as_posix())
        if self.protected(inner) or self.protected(rel):
            raise ToolError(
                f"{rel} belongs to the bot's internal state and cannot be used with this tool "
                "(keep your own files in a folder, e.g. notes/)"
            )
        return real

    def inner(self, real: Path) -> PurePosixPath:
        """``real`` (already located) relative to the workspace."""
        return PurePosixPath(real.relative_to(self.root.resolve()).as_posix())

    def open_folder(self, folder: Path, rel: PurePosixPath, *, create: bool = False) -> int:
        """A descriptor of ``folder`` (located: inside the workspace), reached from the workspace one name
        at a time and never through a symbolic link (``create``: making missing folders, 0700).

        :meth:`locate` looked at names: a folder swapped for a link since (``ln``/``mv`` in the shell
        tool, racing a parallel call) must fail here, not lead into the bot's state or out of the
        workspace. ``rel`` names the path in the error."""
        root = self.root.resolve()
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name in folder.relative_to(root).parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, DIR_MODE, dir_fd=fd)
                inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = inner
        except OSError as exc:
            os.close(fd)
            raise ToolError(
                f"a folder on the path of {rel} changed while it was used ({exc.strerror}); refused"
            ) from None
        return fd


def _joined(root: Path, rel: PurePosixPath) -> Path:
    """``root / rel`` resolved, refused plainly when the workspace's own path in front of ``rel`` takes it
    past PATH_MAX: ``rel`` alone is within :data:`MAX_PATH_BYTES`, but a workspace deep in the disk leaves
    less room, and the tool crashed with ENAMETOOLONG on the first look at the file."""
    try:
        real = (root / rel).resolve()
    except OSError as exc:  # (a non-strict resolve keeps going past it today)
        if exc.errno != errno.ENAMETOOLONG:
            raise
    else:
        if _size(str(real)) < PATH_MAX:
            return real
    raise ToolError(
        f"the path is too long for this workspace ({_size(str(root / rel))} bytes with the workspace's path "
        f"in front, over the system's limit of {PATH_MAX - 1}); use a shorter path"
    )
