"""A dice roll, a shared story or a game sent alone reaches the dispatcher as a note, never dropped in
silence (each carries no text, and the channel took such a message for an empty one). The real PTB
against the fake Bot API; a sentinel message shows the ones before it were decided."""

from __future__ import annotations

from pathlib import Path

from tests.channels.telegram.kit import running_channel
from tests.fakes.telegram_server import FakeTelegramServer


async def test_a_dice_a_story_and_a_game_sent_alone_become_notes(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (_, sink):
        tg.push_message(None, dice={"emoji": "🎲", "value": 4})
        tg.push_message(None, story={"chat": {"id": 5, "type": "channel", "title": "News"}, "id": 9})
        photo = [{"file_id": "g1", "file_unique_id": "g1", "width": 9, "height": 9}]
        tg.push_message(None, game={"title": "Chess", "description": "a game", "photo": photo})
        tg.push_message("sentinel")
        received = await sink.wait_for(4)
    assert [m.text for m in received] == [
        "[The user rolled 🎲: 4]",
        "[The user sent a story.]",
        "[The user sent a game.]",
        "sentinel",
    ]
