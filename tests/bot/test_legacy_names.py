"""Two chats whose ids differ only in case (terminal users ``Bob`` and ``bob``) never share a file, even
on a file system that does not tell case apart (macOS's default APFS): ``cli:Bob.json`` and
``cli:bob.json`` were one file there, and the two chats overwrote each other. Today's names write
upper-case letters as ``%XX``; the start renames the files an older membot named."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.config import Settings, load_settings
from bot.domain import InboundMessage, Message, Role, Session
from bot.inbox import Inbox
from bot.session_names import LEGACY_SAFE, encode_id
from bot.sessions import JsonSessionStore
from bot.startup import prepare_workspace


def test_ids_that_differ_only_in_case_have_names_that_differ_in_more() -> None:
    names = [encode_id(sid) for sid in ("cli:Bob", "cli:bob", "cli:BOB", "cli:bOb", "discord:Ab%c3")]
    assert len({name.casefold() for name in names}) == len(names), names
    assert encode_id("telegram:-1001234:7") == "telegram:-1001234:7"  # numbers keep their names


def session(sid: str, text: str) -> Session:
    channel, _, chat = sid.partition(":")
    return Session(sid, channel, chat, messages=[Message(Role.USER, text)])


async def settings_for(workspace: Path) -> Settings:
    return await asyncio.to_thread(load_settings, None, env_file=None, overrides={"workspace": workspace})


def to_legacy(folder: Path, sid: str) -> None:
    """Give ``sid``'s files in ``folder`` the names an older membot gave them."""
    new, old = encode_id(sid), encode_id(sid, safe=LEGACY_SAFE)
    for path in folder.iterdir():
        if path.name.startswith(new + ".") or path.name == new:
            path.rename(folder / (old + path.name[len(new) :]))


async def test_files_an_older_membot_named_are_renamed_at_the_start_and_read_back(tmp_path: Path) -> None:
    settings = await settings_for(tmp_path / "ws")
    await asyncio.to_thread(prepare_workspace, settings)
    store = JsonSessionStore(settings.sessions_dir)
    await store.save(session("cli:Bob", "I am Bob"))
    await store.save(session("cli:bob", "I am bob"))
    inbox = Inbox(settings.workspace / "inbox")
    await inbox.load_pending()
    _, durable = inbox.add(InboundMessage("cli", "Bob", "Bob", "Bob's question"))
    await durable
    chats = settings.memory_dir / "chats"
    (chats / encode_id("cli:Bob")).mkdir(parents=True)
    (chats / encode_id("cli:Bob") / "MEMORY.md").write_text("Bob's notes")
    for folder in (settings.sessions_dir, settings.workspace / "inbox", chats):
        to_legacy(folder, "cli:Bob")
    assert (settings.sessions_dir / "cli:Bob.json").exists()

    for _ in range(2):  # (a second start finds nothing to do)
        await asyncio.to_thread(prepare_workspace, settings)

    store = JsonSessionStore(settings.sessions_dir)
    bob, other = await store.load("cli:Bob"), await store.load("cli:bob")
    assert bob is not None and [m.content for m in bob.messages] == ["I am Bob"]
    assert other is not None and [m.content for m in other.messages] == ["I am bob"]
    pending = await Inbox(settings.workspace / "inbox").load_pending()
    assert [(e.message.session_id, e.message.text) for e in pending] == [("cli:Bob", "Bob's question")]
    assert (chats / encode_id("cli:Bob") / "MEMORY.md").read_text() == "Bob's notes"
    names = [p.name for folder in (settings.sessions_dir, chats) for p in folder.iterdir()]
    assert not [name for name in names if "Bob" in name], names
