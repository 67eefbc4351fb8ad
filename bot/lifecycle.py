"""Running membot as a service: start channels in order, serve until a signal, then shut down gracefully.

Start-up (the steps before this runner are done by ``bot.app.build_core``: config validated, workspace
locked, checked and its permissions fixed, models.json loaded): first the dispatcher loads what the
inbox still holds from the previous run (before any channel can accept a message, so nothing new can
overtake or overwrite it), then channels start one by one, in order; each chat's recovered work runs as
soon as its own channel is up, not after the slowest one. A channel that fails to start is logged with
its name and the reason; ``lifecycle.on_channel_failure`` decides what follows: ``"stop"`` stops what
already started and exits non-zero, ``"degraded"`` keeps serving with the rest while ``/healthz``
reports the failed channel (503). With no channel up at all, it always stops.

Once started, :func:`settle_heap` tunes the garbage collector for serving (see its doc).

Shutdown on the first SIGTERM or SIGINT, in this order:

1. the dispatcher stops starting turns and running turns get ``lifecycle.grace_period`` seconds to
   finish; the rest are cancelled, saving what they have. Messages that arrive meanwhile are still
   accepted into the durable inbox (senders are told the answer comes after the restart); they, the
   queued ones and the turns cut short are answered after the next start;
2. every session still dirty in memory is saved, then the flush callables run (pending memory writes);
3. channels stop, in reverse start order (so replies of finishing turns could still go out in step 1);
4. the process exits 0.

:meth:`ServiceRunner.run` takes these steps itself. ``membot run`` (``bot/serve.py``) instead calls
:meth:`ServiceRunner.serve` inside ``build_core``, whose one exit stack takes the same steps in the same
order when ``serve`` returns: each part is closed once, by its owner.

A second signal exits at once with ``128 + signal``. That cannot corrupt a file: every write of user
data is atomic (temp file, fsync, rename) or an append whose torn tail readers ignore (bot/storage.py),
so dying in the middle of one leaves the previous state; and nothing accepted is lost, as after a kill:
the inbox keeps every message until its answer was delivered. It is ``os._exit``: no more Python code
runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Protocol

import structlog

from bot.config import LifecycleSettings
from bot.errors import MembotError
from bot.ports import ChannelHealth, ChannelPort

log = structlog.get_logger(__name__)

EXIT_OK = 0
EXIT_CHANNEL_FAILED = 1
WATCH_EVERY = 5.0  # seconds between looks at the channels' health while serving

# The cyclic GC's thresholds once started (Python's default is 700, 10, 10): see settle_heap.
GC_THRESHOLDS = (10_000, 10, 10)

ChannelStarter = Callable[[str], Awaitable[ChannelPort]]
Flush = Callable[[], Awaitable[None]]
HardExit = Callable[[int], None]


def settle_heap() -> None:
    """Tune the cyclic garbage collector for serving: call it once start-up has loaded what lives as
    long as the process (modules, channels, the memory store and its indexes).

    A turn leaves no cyclic garbage (bot/llm/transport.py breaks httpx's one), yet the collector ran
    every 700 allocations, and every ~200 turns walked the whole heap, start-up's ~100,000 objects
    included: under load (``bench/concurrency.py``, 200 chats x 5 messages, memory on) 0.8-0.9 ms of
    CPU per turn, and full collections of 110-130 ms. So start-up's objects are frozen (the collector
    never walks them again; reference counting still frees them) and the youngest generation is
    collected every 10,000 allocations: 0.2-0.3 ms per turn, no full collection in 1,000 turns, the
    longest pause 35-65 ms (a collection takes 20-40 ms where it took 5-10, ~30 times less often).
    The young generations are collected first (1-2 ms; they hold start-up's last garbage), not the
    whole heap (70-80 ms more before ready, for nothing: it found none). A cycle that does form (a
    failed turn's traceback) is still collected, only a little later.
    """
    gc.collect(1)
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class Drainable(Protocol):
    """What the runner needs from the dispatcher."""

    async def recover(self) -> int: ...

    async def close(self, grace: float) -> None: ...


class ServiceRunner:
    """Owns the service's lifetime: see the module doc for the order of start-up and shutdown.

    ``hard_exit`` (default ``os._exit``) is what the second signal calls; tests pass a recorder.
    Use :meth:`channel_health` as the /healthz source: it includes channels that failed to start.
    """

    def __init__(
        self,
        settings: LifecycleSettings,
        *,
        hard_exit: HardExit = os._exit,
        watch_every: float = WATCH_EVERY,
        # SIGHUP too: an ssh or tmux session hanging up must drain, not kill mid-turn.
        signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP),
    ) -> None:
        self._settings = settings
        self._hard_exit = hard_exit
        self._watch_every = watch_every
        self._signals = tuple(signals)
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()
        self._stop_signal: signal.Signals | None = None
        self._health: dict[str, ChannelHealth] = {}
        self._started: list[ChannelPort] = []

    def channel_health(self) -> dict[str, ChannelHealth]:
        """Each configured channel's health, live; a channel that failed to start shows ``failed``."""
        return dict(self._health)

    def request_stop(self) -> None:
        """Begin the graceful shutdown (what the first signal does)."""
        self._stop.set()

    async def wait_stop(self) -> None:
        """Returns once a stop was requested: for ``membot chat``, which serves no channel list but
        ends on SIGTERM and SIGHUP as ``membot run`` does (a second one still exits at once)."""
        await self._stop.wait()

    async def wait_started(self) -> None:
        """Returns once the channels are up and the inbox recovered (``membot_started``): for work that
        must not delay that, such as ``membot run``'s look at the model endpoint."""
        await self._ready.wait()

    @property
    def stop_signal(self) -> signal.Signals | None:
        """The signal that requested the stop; None before one did, or after :meth:`request_stop`."""
        return self._stop_signal

    async def run(
        self,
        channels: Sequence[str],
        *,
        start_channel: ChannelStarter,
        dispatcher: Drainable,
        flushers: Sequence[Flush] = (),
    ) -> int:
        """Start ``channels``, serve until stopped, shut down; returns the process exit code."""
        with self.handling_signals():
            code = await self.serve(channels, start_channel=start_channel, recover=dispatcher.recover)
            if code == EXIT_OK:
                await self._drain(dispatcher, flushers)
            await self._stop_channels()
            if code == EXIT_OK:
                log.info("membot_stopped")
            return code

    @contextlib.contextmanager
    def handling_signals(self) -> Iterator[None]:
        """While held, the first signal begins the graceful shutdown and a second one exits at once.

        Hold it over the shutdown too (``bot/serve.py`` holds it over ``build_core``), so that a second
        signal during the drain still exits at once.
        """
        loop = asyncio.get_running_loop()
        for sig in self._signals:
            with contextlib.suppress(NotImplementedError):  # not on Windows' proactor loop
                loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            yield
        finally:
            for sig in self._signals:
                with contextlib.suppress(NotImplementedError):
                    loop.remove_signal_handler(sig)

    async def serve(
        self, channels: Sequence[str], *, start_channel: ChannelStarter, recover: Callable[[], Awaitable[int]]
    ) -> int:
        """Recover the inbox, start ``channels`` and return once a stop is requested: ``EXIT_OK``, or
        ``EXIT_CHANNEL_FAILED`` at once when the service must not go on. The shutdown is the caller's."""
        await recover()
        if not await self._start_all(channels, start_channel):
            return EXIT_CHANNEL_FAILED
        settle_heap()  # everything long-lived is loaded now, the channels' modules included
        log.info("membot_started", channels=[c.name for c in self._started])
        self._ready.set()
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._watch_every):
                    await self._stop.wait()
            if self._must_stop_now():
                return EXIT_CHANNEL_FAILED
        log.info("membot_stopping", grace_period=self._settings.grace_period)
        return EXIT_OK

    def _must_stop_now(self) -> bool:
        """A channel that failed while serving (a revoked token) is judged like one that failed to start:
        with the policy ``stop``, or with no channel left up, the service ends with a non-zero code, so a
        supervisor (systemd ``Restart=on-failure``) sees it instead of a process that serves nothing."""
        failed = [c.name for c in self._started if c.health.state == "failed"]
        if not failed or (self._settings.on_channel_failure != "stop" and len(failed) < len(self._started)):
            return False
        log.error("membot_channel_failed", channels=failed, errors=[c.health.error for c in self._started])
        return True

    # -- signals ------------------------------------------------------------------------------------

    def _on_signal(self, sig: signal.Signals) -> None:
        if not self._stop.is_set():
            log.info("signal_received", signal=sig.name, action="graceful shutdown; again to exit at once")
            self._stop_signal = sig
            self._stop.set()
            return
        log.warning("signal_received", signal=sig.name, action="exiting now")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        # Safe mid-write: see the module doc (atomic replaces, appends with ignored torn tails).
        self._hard_exit(128 + int(sig))

    # -- start-up -----------------------------------------------------------------------------------

    async def _start_all(self, names: Sequence[str], start_channel: ChannelStarter) -> bool:
        """Start each channel; False when the service must not go on (policy ``stop``, or none is up)."""
        for name in names:
            self._health[name] = ChannelHealth(state="starting")
            try:
                channel = await start_channel(name)
            except Exception as exc:
                reason = str(exc) or type(exc).__name__
                self._health[name] = ChannelHealth(state="failed", error=reason)
                if isinstance(exc, MembotError):  # ours carry a clear message; no traceback needed
                    log.error("channel_start_failed", channel=name, error=reason)
                else:
                    log.exception("channel_start_failed", channel=name, error=reason)
                if self._settings.on_channel_failure == "stop":
                    log.error(
                        "membot_not_started",
                        reason=f"channel {name!r} failed to start and lifecycle.on_channel_failure is "
                        "'stop' (set MEMBOT_LIFECYCLE__ON_CHANNEL_FAILURE=degraded to run without it)",
                    )
                    return False
                continue
            self._health[name] = channel.health
            self._started.append(channel)
        if not self._started:
            log.error("membot_not_started", reason="no channel could be started")
            return False
        failed = [n for n, h in self._health.items() if h.state == "failed"]
        if failed:
            log.warning("membot_degraded", failed_channels=failed)
        return True

    # -- shutdown -----------------------------------------------------------------------------------

    async def _drain(self, dispatcher: Drainable, flushers: Sequence[Flush]) -> None:
        try:
            await dispatcher.close(self._settings.grace_period)
        except Exception:
            log.exception("dispatcher_close_failed")
        for flush in flushers:
            try:
                async with asyncio.timeout(self._settings.grace_period):
                    await flush()
            except Exception:  # TimeoutError included: log it and keep shutting down
                log.exception("flush_failed", flush=getattr(flush, "__qualname__", repr(flush)))

    async def _stop_channels(self) -> None:
        # Reverse start order; one failing stop does not keep the others running.
        while self._started:
            channel = self._started.pop()
            try:
                await channel.stop()
            except Exception:
                log.exception("channel_stop_failed", channel=channel.name)
