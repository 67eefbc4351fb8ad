"""The memory package exports exactly its public surface."""

import bot.memory


def test_all_matches_public_names() -> None:
    public = {n for n in vars(bot.memory) if not n.startswith("_") and n[0].isupper()}
    assert set(bot.memory.__all__) == public
