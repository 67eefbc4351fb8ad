"""``python -m bot`` is the same as ``membot``."""

from bot.cli import main

main()
