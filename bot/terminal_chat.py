"""``membot chat``: a conversation in this terminal, over the full pipeline, until the user quits.

The bot is the one :func:`bot.app.build_core` builds, with the terminal channel (``bot.app``) attached;
this module owns what is particular to a terminal session: the log goes to a file, Ctrl-C stops the
running answer (or quits at the prompt), and SIGTERM or SIGHUP (the terminal closed) end it as they end
``membot run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Sequence

from bot.app import build_core, open_channel, terminal_channel
from bot.config import Settings
from bot.lifecycle import HardExit, ServiceRunner, settle_heap
from bot.logging import configure_logging
from bot.workspace_lock import unusable


async def run_chat(settings: Settings) -> None:
    """``membot chat``: the terminal channel over the full pipeline until the user quits.

    SIGTERM and SIGHUP (the terminal closed) stop it as they stop ``membot run``, not as a kill: the
    running answer gets ``lifecycle.grace_period`` to finish (none after SIGHUP: no one would see it),
    then is cut short, saving what it has; what is not answered yet is answered at the next start, and
    the chat exits 0. A second signal exits at once with 128 + signal (``bot/lifecycle.py``).
    """
    # The terminal is the chat: log lines and tracebacks go to a file, the user sees plain replies.
    try:
        await asyncio.to_thread(
            configure_logging, level=settings.log_level, secrets=settings.secrets, file=settings.chat_log
        )
    except OSError as exc:  # its log is the workspace's first write: said as `membot run` says it (78)
        raise unusable(settings.workspace, exc) from None
    terminal_fds = [fd for fd in (1, 2) if os.isatty(fd)]  # after a hang-up isatty says False
    runner = ServiceRunner(
        settings.lifecycle, signals=(signal.SIGTERM, signal.SIGHUP), hard_exit=_exit_restoring_terminal()
    )
    with runner.handling_signals():  # over the shutdown too: a second signal then exits at once
        async with build_core(settings) as core:
            channel = await terminal_channel(core)
            loop = asyncio.get_running_loop()

            stopping: set[asyncio.Task[int | None]] = set()

            def on_interrupt() -> None:
                # Once the reply is printed the turn may still be saving; Ctrl-C then quits (the
                # shutdown lets it finish), it does not "stop" an answer the user already has.
                if not (channel.waiting_for_reply and core.dispatcher.is_running(channel.session_id)):
                    channel.close()
                    return
                if stopping:  # a second press while the first stop runs: one stop, one "[stopped]"
                    return
                channel.notice("[stopping the answer — Ctrl-C again at the prompt quits]")
                task = loop.create_task(core.dispatcher.stop(channel.session_id))
                stopping.add(task)
                task.add_done_callback(stopping.discard)
                task.add_done_callback(lambda _: channel.answer_stopped())

            async def until_quit() -> None:
                await channel.wait_closed()
                # The input ended (``echo hi | membot chat``, Ctrl-D): what was typed is answered first,
                # unless it waits for the model: it stays pending, and the next start answers it.
                await core.dispatcher.settled(channel.session_id, or_waiting_for_model=True)

            channel.interrupt = on_interrupt  # Ctrl-C as a key, at the line editor's input line
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(signal.SIGINT, on_interrupt)
            sys.stdout.write(
                f"membot — model {settings.llm.model}; /help for commands, Ctrl-D to quit. "
                f"Log: {settings.chat_log}\n"
            )
            await core.dispatcher.recover()
            channel.show_unanswered([m.text for m in core.inbox.pending_messages(channel.session_id)])
            await open_channel(channel, core)  # stopped by core.edge, once the dispatcher has drained
            settle_heap()  # started: as ``membot run`` does (bot/lifecycle.py)
            try:
                await _first_of(until_quit(), runner.wait_stop())
                if runner.stop_signal is not None:
                    hung_up = runner.stop_signal == signal.SIGHUP
                    if hung_up:
                        _leave_closed_terminal(terminal_fds)
                    # The drain build_core's exit would run (it then finds nothing left), done here so
                    # that what the grace period still prints comes before "bye".
                    await core.dispatcher.close(0 if hung_up else settings.lifecycle.grace_period)
            finally:
                with contextlib.suppress(NotImplementedError):
                    loop.remove_signal_handler(signal.SIGINT)
                # The line editor's input line leaves the screen first (core.edge would stop the
                # channel only after "bye", which then landed in the middle of the input line).
                await channel.stop()
                sys.stdout.write("\nbye — the conversation is saved.\n")


async def _first_of(*waits: Awaitable[None]) -> None:
    """Returns when the first of ``waits`` does (raising what it raised); the others are cancelled."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()


def _exit_restoring_terminal() -> HardExit:
    """The second signal's exit at once (``os._exit``), with the terminal's modes put back first: the
    line editor holds it in raw mode for the whole chat (channels/terminal_prompt.py), and no Python
    code runs after ``os._exit`` to leave it, so the shell got a terminal that echoed nothing typed."""
    import termios

    try:
        modes = termios.tcgetattr(0)  # before the chat changes them
    except (termios.error, OSError):  # stdin is no terminal: nothing to put back
        return os._exit

    def hard_exit(code: int) -> None:
        with contextlib.suppress(termios.error, OSError):  # (the terminal may be gone: a hang-up)
            signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # in the background too (else it stops us)
            termios.tcsetattr(0, termios.TCSANOW, modes)
        os._exit(code)

    return hard_exit


def _leave_closed_terminal(fds: Sequence[int]) -> None:
    """After SIGHUP the terminal is gone and every write to it fails (EIO): "bye" did, and the chat
    exited 1 instead of 0. What is still written (a stream's last piece, "bye") now goes nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in fds:
        os.dup2(devnull, fd)
    os.close(devnull)
