"""The commands package exports exactly the names defined in it that other layers use."""

import bot.commands


def test_all_matches_public_names() -> None:
    defined = {
        name
        for name, value in vars(bot.commands).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == "bot.commands"
    }
    # A type alias has no __module__ of ours; Admins and SessionCommands are re-exported from
    # bot/commands/session.py.
    assert set(bot.commands.__all__) == defined | {"Admins", "CommandHandler", "SessionCommands"}
