"""The Telegram channel, as one package so its PTB-specific parts stay together and out of the rest.

Only :class:`TelegramChannel` is meant for the composition root; the modules beside it are its parts:
``channel`` (lifecycle and the path of a message), ``polling`` / ``webhook`` (how updates arrive),
``journal`` / ``handover`` / ``lanes`` (durable until the dispatcher has them, each chat's in order),
``access`` / ``addressing`` (who may write, and whether a message is for this bot), ``inbound`` /
``media`` / ``files`` (turning updates into messages), ``outbound`` / ``format`` / ``sent`` /
``refusals`` (replies as Telegram HTML) and ``commands`` (the command menu). Importing the package
loads PTB but not aiohttp, which only the webhook needs.
"""

from channels.telegram.channel import TelegramChannel

__all__ = ["TelegramChannel"]
