"""The Telegram channel, as one package so its PTB-specific parts stay together and out of the rest.

Only :class:`TelegramChannel` is meant for the composition root; the modules beside it are its parts:
``channel`` (lifecycle and the path of a message), ``polling`` / ``webhook`` (how updates arrive),
``journal`` / ``handover`` (durable until the dispatcher has them), ``inbound`` / ``media`` (turning
updates into messages) and ``outbound`` / ``format`` (replies as Telegram HTML). Importing the package
loads PTB but not aiohttp, which only the webhook needs.
"""

from channels.telegram.channel import TelegramChannel

__all__ = ["TelegramChannel"]
