"""The ``membot`` command line. Each subcommand group lives in its own module of this package."""

from __future__ import annotations

from bot.cli.root import app, main

__all__ = ["app", "main"]
