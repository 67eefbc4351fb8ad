"""``membot pairing``: approve, list and revoke chat users who asked for access with a pairing code."""

from __future__ import annotations

import unicodedata
from typing import Annotated

import typer
from rich.table import Table

from bot.cli.root import app, command_group, console, fail, settings_from
from bot.pairing import approve_code, list_pairings, revoke_user
from bot.printable import printable

pairing_app = command_group("Approve chat users who asked for access (pairing codes).")
app.add_typer(pairing_app, name="pairing")


@pairing_app.command("approve")
def approve(
    ctx: typer.Context, code: Annotated[str, typer.Argument(help="The code the bot showed the user")]
) -> None:
    """Admit the user who was given CODE."""
    approval = approve_code(settings_from(ctx).workspace, code)
    if approval is None:
        fail(f"no pending pairing code {code!r} (codes expire after an hour; see `membot pairing list`)")
    name = _one_line(approval.user_name)
    who = f"{name} ({_one_line(approval.user_id)})" if name else _one_line(approval.user_id)
    console.print(f"approved {who} on {approval.channel}")


@pairing_app.command("list")
def list_(ctx: typer.Context) -> None:
    """Show pending codes and approved users."""
    pending, approved = list_pairings(settings_from(ctx).workspace)
    table = Table("state", "channel", "user id", "name", "code / since")
    for req in pending:
        until = f"{req.code} (until {req.expires_at:%H:%M} UTC)"
        table.add_row("pending", req.channel, _one_line(req.user_id), _one_line(req.user_name), until)
    for done in approved:
        since = f"{done.approved_at:%Y-%m-%d}"
        table.add_row("approved", done.channel, _one_line(done.user_id), _one_line(done.user_name), since)
    console.print(table if pending or approved else "no pairing requests and no approved users")


@pairing_app.command("revoke")
def revoke(ctx: typer.Context, channel: str, user_id: str) -> None:
    """Withdraw a user's approval (the allowlist in the config is not changed)."""
    if not revoke_user(settings_from(ctx).workspace, channel, user_id):
        fail(f"{user_id} on {channel} was not approved by pairing")
    console.print(f"revoked {user_id} on {channel}")


def _one_line(text: str) -> str:
    """A stranger's name (their platform profile's) as the operator's terminal may show it: its control
    characters (ESC sequences that clear the screen or hide text, bidi overrides that reverse it) made
    visible, never obeyed (bot/printable.py), on one line, its line breaks as spaces (a name with a line
    break in it would add a fake row to the table), and its invisible format characters shown too: this
    is the table the operator approves people from, and "ad\u200bmin" must not pass for "admin" (the
    zero-width joiner stays: it holds emoji together)."""
    shown = printable(" ".join(text.split()))
    return "".join("\ufffd" if _invisible(c) else c for c in shown)


def _invisible(char: str) -> bool:
    return unicodedata.category(char) == "Cf" and char != "\u200d"
