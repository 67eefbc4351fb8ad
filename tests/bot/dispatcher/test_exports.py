"""The dispatcher package exports exactly what other layers use: the dispatcher and its turn observer."""

import bot.dispatcher


def test_all_matches_public_names() -> None:
    public = {n for n in vars(bot.dispatcher) if not n.startswith("_") and n[0].isupper()}
    assert set(bot.dispatcher.__all__) == public == {"Dispatcher", "TurnObserver"}
