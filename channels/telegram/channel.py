"""The Telegram channel: python-telegram-bot (PTB) driven by hand, next to the rest of membot's loop.

Start-up follows PTB's advice for sharing a loop: ``initialize`` (and the command menu, registered
when it changed: :mod:`channels.telegram.commands`) → ``start``, then our own long polling
(:mod:`channels.telegram.polling`) or our own webhook endpoint (:mod:`channels.telegram.webhook`);
``stop`` runs the same steps in reverse. PTB's ``Updater`` and ``run_polling`` are not used: the
``Updater`` confirms updates as soon as it fetches them. A message takes this path:

0. It is stored in the channel's update journal (:mod:`channels.telegram.journal`) and only then
   confirmed to Telegram; an update the journal already has (a redelivery) stops here. Steps 1-4 run
   for a chat's updates one at a time, in order, and for several chats side by side
   (:mod:`channels.telegram.handover`): a slow download holds back only its own chat.
1. Only new messages count: edits, channel posts (also as Telegram copies them into the channel's
   discussion group, sent by "Telegram") and messages from bots are ignored, but for an admin posting
   anonymously as the group (named by their signature, else "Anonymous admin"). A group's
   upgrade to a supergroup (a new chat id) is logged with what the operator has to do. Steps 1-3, and
   the hand-on of step 4, are :mod:`channels.telegram.intake`.
2. Access, deny by default (:mod:`channels.telegram.access`): private chats need an allowlisted or
   paired user (strangers get a pairing code, offered at most once a minute); groups must be allowlisted
   and, unless configured otherwise, mention or reply to the bot (:mod:`channels.telegram.addressing`).
3. The bot's mention is cut out, ``/cmd@ThisBot`` becomes ``/cmd`` (``/cmd@OtherBot`` is ignored), and
   what the message replies to or forwards is put before it (:mod:`channels.telegram.addressing`);
   photos and documents are fetched, never past their size limit (:mod:`channels.telegram.media`,
   :mod:`channels.telegram.files`).
4. Messages a client split from one paste are joined (:class:`~channels.telegram.inbound.PasteJoiner`)
   and handed to the dispatcher. Session ``telegram:<chat>``, or ``telegram:<chat>:<topic>`` in forums.
5. Once ``Dispatcher.submit`` returned (the message is in the durable inbox), the update is released
   from the journal. A submit that fails for lack of storage is retried with backoff, never dropped.

Replies go out through :class:`~channels.telegram.outbound.TelegramOutbox`: Telegram HTML in chunks
under 4096 UTF-16 units, plain-text fallback, 429/5xx retries, pacing, typing and streaming.
``telegram.error`` never leaves the ``channels.telegram`` package: callers see ChannelError/ConfigError.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

import structlog
from telegram import Bot, Update
from telegram.error import Conflict, InvalidToken, TelegramError
from telegram.ext import AIORateLimiter, Application, ApplicationBuilder

from bot.config import TelegramSettings
from bot.domain import OutboundMessage
from bot.errors import ChannelError, ConfigError
from bot.pairing import PairingStore
from channels.base import Channel, InboundSink, PartialSink
from channels.outage import StorageOutage
from channels.telegram.access import TelegramAccess
from channels.telegram.commands import sync_commands
from channels.telegram.files import TelegramFiles
from channels.telegram.handover import HandOver
from channels.telegram.inbound import PasteJoiner
from channels.telegram.intake import TelegramIntake
from channels.telegram.journal import JOURNAL_FILE, UpdateJournal
from channels.telegram.outbound import ChatPacer, TelegramOutbox
from channels.telegram.polling import ALLOWED_UPDATES, UpdatePoller, fetch_raw
from channels.telegram.sent import SENT_FILE, sent_chunks

if TYPE_CHECKING:
    from channels.telegram.webhook import WebhookServer

log = structlog.get_logger(__name__)

_MAX_ATTEMPTS = 3  # an update whose intake fails this often for another reason than storage is dropped
# How long a Bot API request may wait for its answer (PTB's default is 5 s). A send that timed out may
# have gone out (Telegram took it, its answer was late), and it is sent again: a slow Bot API must not
# make the chat get each answer several times. Only a request that hangs this long still can.
_READ_TIMEOUT = 30.0


class TelegramChannel(Channel):
    """Telegram via PTB 22; construct in the composition root, then ``await start()`` (see module doc).

    Args:
        settings: the ``[telegram]`` settings slice.
        submit: where normalized messages go (``Dispatcher.submit``); awaiting it means "queued".
        pairing: the shared pairing store (``workspace/pairing.json``).
        state_dir: where the update journal, the chunks sent of answers cut short and the hash of the
            registered command menu are kept (``<workspace>/state``).
        commands: ``(name, description)`` pairs for Telegram's command menu (``CommandRouter.commands``).
        vision_supported: asked per photo, so a model switch takes effect at once.
        max_inbound_chars: longer inbound text is cut with a note (``sessions.max_inbound_chars``).
        max_retries, retry_base_delay: retries of 429s (rate limiter) and of timeouts/5xx (backoff).
        typing_interval, stream_interval: how often "typing…" is refreshed and a stream is edited.
        chat_interval, chat_burst: per-chat pacing (a burst, then one message per interval).
        storage_retry_delay, storage_retry_max_delay: backoff while storage fails (doubling, bounded).
        monotonic: the clock for throttling and for pairing offers (pacing follows the event loop's clock).
    """

    name: ClassVar[str] = "telegram"

    def __init__(
        self,
        settings: TelegramSettings,
        submit: InboundSink,
        *,
        pairing: PairingStore,
        state_dir: Path,
        commands: Sequence[tuple[str, str]] = (),
        vision_supported: Callable[[], bool] = lambda: False,
        max_inbound_chars: int = 16000,
        max_retries: int = 4,
        retry_base_delay: float = 1.0,
        typing_interval: float = 5.0,
        stream_interval: float = 1.5,
        chat_interval: float = 1.0,
        chat_burst: int = 3,
        storage_retry_delay: float = 0.5,
        storage_retry_max_delay: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(submit)
        self._settings = settings
        self._state_dir = state_dir
        self._commands = list(commands)
        self._access = TelegramAccess(
            settings,
            pairing,
            channel=self.name,
            send=lambda chat, text: self._out.send_plain(chat, text),
            monotonic=monotonic,
        )
        self._intake = TelegramIntake(
            settings,
            self._access,
            channel=self.name,
            state_dir=state_dir,
            commands=tuple(name for name, _ in self._commands),
            bot=lambda: self.bot,
            vision_supported=vision_supported,
            download=self._download,
            hand_on=lambda inbound, alone: self._joiner.add(inbound, alone=alone),
        )
        self._new_outage = functools.partial(  # (each one keeps every message out while it lasts)
            StorageOutage,
            first_delay=storage_retry_delay,
            max_delay=storage_retry_max_delay,
            clock=monotonic,
            health=self.health,
        )
        self._intake_outage = self._new_outage("taking Telegram messages in")
        self._new_joiner = functools.partial(
            PasteJoiner,
            self.handle_inbound,
            settings.join_window,
            max_chars=max_inbound_chars,
            outage=self._intake_outage,
            max_attempts=_MAX_ATTEMPTS,
        )
        self._joiner = self._new_joiner()
        self._max_retries = max_retries
        self._sent = sent_chunks(state_dir / SENT_FILE)
        self._new_outbox: Callable[[Bot], TelegramOutbox] = functools.partial(
            TelegramOutbox,
            max_retries=max_retries,
            retry_base_delay=retry_base_delay,
            typing_interval=typing_interval,
            stream_interval=stream_interval,
            pacer=ChatPacer(chat_interval, chat_burst),
            monotonic=monotonic,
            sent=self._sent,
        )
        self._outbox: TelegramOutbox | None = None
        self._files: TelegramFiles | None = None
        self._app: Application[Any, Any, Any, Any, Any, Any] | None = None
        self._webhook: WebhookServer | None = None
        self._poller: UpdatePoller | None = None
        self._polling: asyncio.Task[None] | None = None
        self._journal: UpdateJournal | None = None
        self._handover: HandOver | None = None
        self._handing_over: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------------------

    @property
    def bot(self) -> Bot:
        if self._app is None:
            raise ChannelError("the Telegram channel is not started")
        return self._app.bot  # type: ignore[no-any-return]

    async def start(self) -> None:
        settings = self._settings
        if settings.token is None:
            raise ConfigError("Telegram needs a bot token: set MEMBOT_TELEGRAM__TOKEN (from @BotFather)")
        if settings.mode == "webhook" and not (settings.webhook_url and settings.webhook_secret):
            raise ConfigError(
                "telegram.mode = 'webhook' needs telegram.webhook_url and telegram.webhook_secret "
                "(MEMBOT_TELEGRAM__WEBHOOK_URL, MEMBOT_TELEGRAM__WEBHOOK_SECRET)"
            )
        self.health.state = "starting"
        builder = (
            ApplicationBuilder()
            .token(settings.token.get_secret_value())
            .rate_limiter(AIORateLimiter(max_retries=self._max_retries))
            .read_timeout(_READ_TIMEOUT)
        )
        if settings.base_url:
            builder = builder.base_url(settings.base_url)
        if settings.base_file_url:
            builder = builder.base_file_url(settings.base_file_url)
        builder = builder.updater(None)
        app = await asyncio.to_thread(builder.build)  # PTB resolves file paths while building
        self._app = app
        await self._sent.load()  # how far answers cut short by a kill got: only the rest goes out
        self._outbox = self._new_outbox(app.bot)
        self._files = TelegramFiles(app.bot, self._outbox, deadline=settings.download_timeout)
        try:
            await app.initialize()
            await sync_commands(app.bot, self._commands, self._state_dir, self._out)
            self._joiner = self._new_joiner()
            journal = UpdateJournal(
                self._state_dir / JOURNAL_FILE, outage=self._new_outage("the Telegram update journal")
            )
            resumed = await journal.load(app.bot.id)  # held updates of an earlier run are taken in first
            self._journal = journal
            await app.start()
            self._handover = HandOver(
                journal,
                self._intake_update,
                outage=self._intake_outage,
                max_attempts=_MAX_ATTEMPTS,
                resumed=resumed,
                resumed_done=self._joiner.cut,  # never joined to what arrives after the start
            )
            self._handing_over = asyncio.create_task(self._handover.run(), name="telegram-handover")
            if settings.mode == "webhook":
                await self._start_webhook()
            else:
                await self._start_polling()
        except BaseException as exc:
            await self._shutdown()
            self.health.state = "failed"
            if isinstance(exc, InvalidToken):  # its message quotes the token: never pass it on
                self.health.error = "Telegram rejected the bot token"
                raise ChannelError(
                    "Telegram rejected the bot token: check MEMBOT_TELEGRAM__TOKEN (from @BotFather)"
                ) from None
            self.health.error = f"start-up failed: {type(exc).__name__}"
            if isinstance(exc, TelegramError):
                raise ChannelError(f"Telegram start-up failed: {exc}") from exc
            raise
        self.health.state = "running"
        log.info("telegram_started", bot=self.bot.username, mode=settings.mode)

    async def stop(self) -> None:
        """Stop receiving, hand on what is waiting in the join window, then close PTB (reverse order).

        Updates not handed on by then (not yet taken in, or refused by storage) stay in the journal
        and are taken in at the next start."""
        await self._shutdown()
        self.health.state = "stopped"

    async def _shutdown(self) -> None:
        app = self._app
        if self._webhook is not None:
            await self._webhook.stop()
            self._webhook = None
        polling, self._polling = self._polling, None
        for task in (polling, self._handing_over):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._handing_over = None
        if app is not None and app.running:
            await app.stop()
        await self._joiner.close()
        if self._handover is not None:
            await self._handover.drain()
            self._handover = None
        journal, self._journal = self._journal, None
        if journal is not None:
            await journal.close()
        await self._sent.close()  # what was only forgotten (answers finished) leaves the file
        if self._poller is not None:
            await self._poller.confirm()  # what is in the journal is safe: let Telegram forget it
            self._poller = None
        files, self._files = self._files, None
        if files is not None:
            await files.close()
        if app is not None:
            await app.shutdown()  # a no-op when initialize() never finished...
            await app.bot.shutdown()  # ...so close the HTTP clients a failed initialize() opened

    async def _start_polling(self) -> None:
        """Polling needs the webhook gone (getUpdates answers 409 while one is set). One still set is
        removed, its pending updates kept, and the log says so: it may be another membot's, in webhook
        mode with the same token, which then gets no more messages without a word."""
        hook = await self._out.call(lambda: self.bot.get_webhook_info(), what="getWebhookInfo")
        await self._out.call(lambda: self.bot.delete_webhook(), what="deleteWebhook")
        if hook.url:
            log.warning(
                "telegram_webhook_removed",
                host=urlsplit(hook.url).hostname,  # not the whole URL: its path may hold a secret
                pending=hook.pending_update_count,
                reason="a webhook was set for this token; polling removed it (its updates are kept)",
                fix="if another membot runs with this token in webhook mode, stop one of them: "
                "a token serves one bot process",
            )
        journal = self._journal
        assert journal is not None
        self._poller = UpdatePoller(
            lambda offset, timeout: self.bot.get_updates(
                offset=offset, timeout=timeout, allowed_updates=ALLOWED_UPDATES
            ),
            lambda updates: journal.accept([u.to_dict() for u in updates]),
            timeout=self._settings.poll_timeout,
            on_error=self._on_poll_error,
            room=journal.room,
            storage_backoff=self._intake_outage.delay,
            fetch_one=lambda offset: fetch_raw(self.bot, offset),
            on_recovered=self._on_poll_recovered,
        )
        self._polling = asyncio.create_task(self._poller.run(), name="telegram-polling")
        self._polling.add_done_callback(self._on_polling_ended)

    def _on_polling_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        self.health.state = "failed"
        error = task.exception()
        revoked = isinstance(error, InvalidToken)
        why = "Telegram rejected the bot token" if revoked else f"{type(error).__name__} (see the log)"
        self.health.error = f"polling stopped: {why}"
        log.error("telegram_polling_ended", error=type(task.exception()).__name__)

    async def _start_webhook(self) -> None:
        from channels.telegram.webhook import register_webhook, webhook_server  # aiohttp: webhook only

        self._webhook = webhook_server(self._settings, self._on_webhook_update)
        await self._webhook.start()
        await register_webhook(self._settings, self.bot, self._out)

    # -- inbound ------------------------------------------------------------------------------------

    async def _on_webhook_update(self, data: dict[str, Any]) -> None:
        """Webhook: returns (Telegram gets its 200) once the update is in the journal."""
        if self._journal is None:
            raise ChannelError("the Telegram channel is stopping")
        await self._journal.accept([data])

    def _on_poll_recovered(self) -> None:
        if self.health.state == "degraded":
            self.health.state = "running"
        self.health.error = None
        log.info("telegram_polling_recovered")

    async def _intake_update(self, data: dict[str, Any]) -> asyncio.Future[None] | None:
        update = Update.de_json(data, self.bot)
        return await self._intake(update.message) if update.message is not None else None

    def _on_poll_error(self, exc: TelegramError) -> None:
        """Polling goes on with backoff after this; the trouble is made visible (/healthz: 503)."""
        if self.health.state == "running":
            self.health.state = "degraded"
        self.health.error = str(exc)
        hint = " (another process polls with the same token?)" if isinstance(exc, Conflict) else ""
        log.warning("telegram_polling_failed", error=f"{exc}{hint}")

    async def _download(self, file_id: str, limit: int) -> bytes | None:
        if self._files is None:
            raise ChannelError("the Telegram channel is not started")
        return await self._files.fetch(file_id, limit=limit)

    # -- outbound (see channels/telegram/outbound.py) ------------------------------------------------

    @property
    def _out(self) -> TelegramOutbox:
        if self._outbox is None:
            raise ChannelError("the Telegram channel is not started")
        return self._outbox

    async def send(self, message: OutboundMessage) -> None:
        try:
            await self._out.send(message)
        except ChannelError:
            self.health.send_failures += 1
            raise
        self.health.sent += 1

    def activity(self, chat_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        return self._out.typing(chat_id)

    def partial_sink(self, chat_id: str, reply_to: str | None = None) -> PartialSink | None:
        return self._out.stream(chat_id, reply_to) if self._settings.streaming else None
