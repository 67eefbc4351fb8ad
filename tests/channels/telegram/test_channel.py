"""The Telegram channel end to end: the real python-telegram-bot against the fake Bot API server.

Each test starts a channel whose dispatcher side is a recording sink (tests/channels/telegram/kit.py).
Messages that must be ignored are followed by a "sentinel" message that must arrive: a chat's updates
are processed in order, so once the sentinel is in, the ignored ones of its chat were decided. Chats are
taken in side by side, so for another chat's (a stranger's) the test also waits until the journal holds
nothing (``all_taken_in``).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from bot.domain import OutboundMessage
from bot.errors import ChannelError
from bot.pairing import PAIRING_FILE, PairingStore, approve_code, revoke_user
from tests.channels.telegram.kit import COMMANDS, RecordingSink, all_taken_in, running_channel
from tests.fakes.telegram_server import FakeTelegramServer, utf16_len

BOT = "membot_test_bot"
GROUP = -100123


async def test_private_round_trip_renders_markdown_as_html(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg:
        sink = RecordingSink(reply="**Hello** _Alice_, see `x < y` & [docs](https://example.com)")
        async with running_channel(tg, tmp_path, sink) as (channel, _):
            tg.push_message("hi there")
            [message] = await sink.wait_for(1)
            [sent] = await tg.wait_for_messages(1)
        assert (message.channel, message.chat_id, message.sender_id) == ("telegram", "777", "42")
        assert message.session_id == "telegram:777"
        assert message.text == "hi there" and message.sender_name == "Alice" and not message.is_group
        assert sent.parse_mode == "HTML"
        assert sent.raw == (
            '<b>Hello</b> <i>Alice</i>, see <code>x &lt; y</code> &amp; <a href="https://example.com">docs</a>'
        )
        assert sent.text == "Hello Alice, see x < y & docs"
        assert sent.reply_to is None  # private chats get no quote of the question
        assert channel.health.sent == 1
        methods = [c.method for c in tg.calls]
        assert methods[:4] == ["getMe", "setMyCommands", "getWebhookInfo", "deleteWebhook"]
        polls = tg.calls_to("getUpdates")
        assert polls[-1].params["timeout"] == 0  # the last call on stop confirms the offset
        assert any(c.params.get("offset") == 2 for c in polls)


async def test_unknown_user_gets_a_pairing_code_and_is_admitted_once_approved(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (_, sink):
        tg.push_message("let me in", chat_id=99, user_id=99, first_name="Mallory")
        [offer] = await tg.wait_for_messages(1, chat_id=99)
        code = re.search(r"membot pairing approve (\S+)", offer.text)
        assert code is not None and offer.parse_mode is None

        tg.push_message("please?", chat_id=99, user_id=99)  # asking again at once: no second offer
        tg.push_message("sentinel")
        assert [m.text for m in await sink.wait_for(1)] == ["sentinel"]
        await all_taken_in(tmp_path)
        assert [m.text for m in sink.received] == ["sentinel"]  # nothing from user 99 got in
        assert len(tg.sent_to(99)) == 1

        assert await asyncio.to_thread(approve_code, tmp_path, code.group(1)) is not None
        tg.push_message("hello again", chat_id=99, user_id=99)
        received = await sink.wait_for(2)
        assert (received[1].text, received[1].sender_id) == ("hello again", "99")


class Ticks:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_strangers_flood_gets_one_offer_and_holds_up_nobody(tmp_path: Path) -> None:
    """An offer waits for the chat's pacing (one message a second after a burst): when updates were taken
    in one at a time, answering every message of a stranger's flood held every allowed user's message up
    behind it (ten held the next one for seven seconds). One offer a minute; after that, the same code
    again."""
    clock = Ticks()
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, chat_interval=1.0, monotonic=clock) as (_, sink),
    ):
        for n in range(10):
            tg.push_message(f"let me in {n}", chat_id=99, user_id=99, first_name="Mallory")
        tg.push_message("sentinel")
        assert [m.text for m in await sink.wait_for(1)] == ["sentinel"]
        await all_taken_in(tmp_path)
        [offer] = tg.sent_to(99)

        clock.now += 61.0  # past the minute
        tg.push_message("still waiting", chat_id=99, user_id=99)
        tg.push_message("sentinel 2")
        assert [m.text for m in await sink.wait_for(2)][1] == "sentinel 2"
        await all_taken_in(tmp_path)
        [_, again] = tg.sent_to(99)
        code = re.search(r"membot pairing approve (\S+)", offer.text)
        assert code is not None and code.group(1) in again.text


async def test_a_stranger_who_blocked_the_bot_is_offered_a_code_once_and_the_rest_flows(
    tmp_path: Path,
) -> None:
    """The pairing offer is refused for good (the stranger blocked the bot): tried once, not three times
    as if the update itself could not be processed, and the messages behind it are taken at once."""
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (_, sink):
        tg.refuse_chat(99)
        tg.push_message("let me in", chat_id=99, user_id=99, first_name="Mallory")
        tg.push_message("sentinel")
        assert [m.text for m in await sink.wait_for(1)] == ["sentinel"]
        await all_taken_in(tmp_path)
        offers = [c for c in tg.calls_to("sendMessage") if c.params.get("chat_id") == 99]
        assert len(offers) == 1


async def test_pairing_off_ignores_strangers_silently(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, pairing=False) as (_, sink):
        tg.push_message("let me in", chat_id=99, user_id=99)
        tg.push_message("sentinel")
        assert [m.text for m in await sink.wait_for(1)] == ["sentinel"]
        await all_taken_in(tmp_path)
        assert tg.sent_to(99) == []


async def approve_mallory(workspace: Path) -> None:
    """The operator approved Mallory (user 99), as ``membot pairing approve`` does."""
    store = PairingStore(workspace / PAIRING_FILE)
    code = await store.request("telegram", "99", "Mallory")
    assert code is not None and await store.approve(code) is not None


async def test_pairing_off_keeps_users_approved_before(tmp_path: Path) -> None:
    """``pairing = false`` stops offering codes; an approval the operator gave stays until revoked."""
    await approve_mallory(tmp_path)
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, pairing=False) as (_, sink):
        tg.push_message("back again", chat_id=99, user_id=99)
        tg.push_message("who am i", chat_id=98, user_id=98)
        tg.push_message("sentinel")
        await sink.wait_for(2)
        await all_taken_in(tmp_path)
        assert sorted(m.text for m in sink.received) == ["back again", "sentinel"]  # two chats: any order
        assert tg.sent_to(98) == []


async def test_a_revoked_user_is_cut_off_at_their_next_message(tmp_path: Path) -> None:
    """``membot pairing revoke`` (another process) takes effect on the running bot at once: no restart."""
    await approve_mallory(tmp_path)
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, pairing=False) as (_, sink):
        tg.push_message("first", chat_id=99, user_id=99)
        assert [m.text for m in await sink.wait_for(1)] == ["first"]
        assert await asyncio.to_thread(revoke_user, tmp_path, "telegram", "99")
        tg.push_message("second", chat_id=99, user_id=99)
        tg.push_message("sentinel")
        await sink.wait_for(2)
        await all_taken_in(tmp_path)
        assert [m.text for m in sink.received] == ["first", "sentinel"]


async def test_group_answers_only_when_addressed_and_only_in_allowed_groups(tmp_path: Path) -> None:
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, allowed_groups=[str(GROUP)], allowed_users=[]) as (_, sink),
    ):
        group = {"chat_id": GROUP, "chat_type": "supergroup", "user_id": 7}
        tg.push_message("just chatting", **group)
        tg.push_message(f"@{BOT} what's the time?", **group)
        tg.push_message("hey @someone_else look", **group)
        tg.push_message("thanks!", reply_to_bot=True, **group)
        tg.push_message(f"@{BOT} hello", chat_id=-100999, chat_type="supergroup")  # group not allowed
        tg.push_message("in a topic", thread_id=7, reply_to_bot=True, **group)
        tg.push_message(f"@{BOT} mentioned in a topic", thread_id=7, **group)
        tg.push_message(f"/help@{BOT}", **group)
        # A slash is not a command for us: a path, another bot's or a client's ("/shrug") are not.
        tg.push_message("/usr/bin/python is broken on my box", **group)
        tg.push_message("/shrug", **group)
        tg.push_message("/status", **group)  # one of ours needs no name
        received = await sink.wait_for(6)
        await asyncio.sleep(0.1)  # room for a wrongly admitted message to show up
    assert [(m.text, m.chat_id) for m in received] == [
        ("what's the time?", str(GROUP)),
        ("thanks!", str(GROUP)),
        ("in a topic", f"{GROUP}:7"),
        ("mentioned in a topic", f"{GROUP}:7"),
        ("/help", str(GROUP)),
        ("/status", str(GROUP)),
    ]
    assert all(m.is_group for m in received)
    assert received[0].session_id == f"telegram:{GROUP}"


async def test_a_group_upgraded_to_a_supergroup_is_logged_with_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The bot fell silent in the new supergroup (its id is not allowed) with only an info line per
    refused message that never said why; now the upgrade is one warning with the new id and the fix."""
    old, new = -4001, -1004001
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, allowed_groups=[str(old)]) as (_, sink),
    ):
        tg.push_message(None, chat_id=old, chat_type="group", migrate_to_chat_id=new)
        tg.push_message(None, chat_id=new, chat_type="supergroup", migrate_from_chat_id=old)
        tg.push_message(f"@{BOT} still there?", chat_id=new, chat_type="supergroup")
        tg.push_message("sentinel")
        await sink.wait_for(1)
        await all_taken_in(tmp_path)
    assert [m.text for m in sink.received] == ["sentinel"]  # the new id is not allowed: no answer there
    [migrated] = [
        r.msg
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg["event"] == "telegram_group_migrated"
    ]
    assert (migrated["old_chat_id"], migrated["new_chat_id"]) == (old, new)
    assert f"add {new} to telegram.allowed_groups" in str(migrated["fix"])
    assert f"telegram:{old}" in str(migrated["fix"])


async def test_the_model_hears_what_a_message_replies_to_and_that_it_was_forwarded(tmp_path: Path) -> None:
    """ "@bot is this true?" under Bob's "The earth is flat" reached the model as "is this true?"."""
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, allowed_groups=[str(GROUP)]) as (_, sink),
    ):
        bobs = tg.user_message("The earth is flat", chat_id=GROUP, chat_type="supergroup", first_name="Bob")
        tg.push_message(f"@{BOT} is this true?", chat_id=GROUP, chat_type="supergroup", reply_to_message=bobs)
        origin = {"type": "user", "date": 1, "sender_user": {"id": 9, "is_bot": False, "first_name": "Carol"}}
        tg.push_message("Meeting moved to 3pm", forward_origin=origin)
        tg.push_message("thanks!", reply_to_bot=True)  # the bot's own words are in the history already
        received = await sink.wait_for(3)
    assert [m.text for m in received] == [
        '[replying to Bob: "The earth is flat"]\nis this true?',
        "[forwarded from Carol]\nMeeting moved to 3pm",
        "thanks!",
    ]


async def test_topic_message_that_only_replies_to_the_topic_start_is_not_a_reply(tmp_path: Path) -> None:
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, allowed_groups=[str(GROUP)]) as (_, sink),
    ):
        topic_start = tg.user_message("topic created", chat_id=GROUP, chat_type="supergroup")
        topic_start["from"] = tg.bot_user
        topic_start["message_id"] = 7
        tg.push_message(
            "chatting", chat_id=GROUP, chat_type="supergroup", thread_id=7, reply_to_message=topic_start
        )
        tg.push_message(f"@{BOT} sentinel", chat_id=GROUP, chat_type="supergroup")
        assert [m.text for m in await sink.wait_for(1)] == ["sentinel"]


async def test_per_group_mention_override(tmp_path: Path) -> None:
    overrides = {"allowed_groups": [str(GROUP)], "groups": {str(GROUP): {"require_mention": False}}}
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, **overrides) as (_, sink):
        tg.push_message("no mention needed here", chat_id=GROUP, chat_type="group")
        [message] = await sink.wait_for(1)
        assert message.text == "no mention needed here"


async def test_group_reply_goes_to_the_topic_and_quotes_the_question(tmp_path: Path) -> None:
    sink = RecordingSink(reply="answer")
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, sink, allowed_groups=[str(GROUP)]) as _,
    ):
        update = tg.push_message(f"@{BOT} question", chat_id=GROUP, chat_type="supergroup", thread_id=7)
        [sent] = await tg.wait_for_messages(1, chat_id=GROUP)
    assert sent.thread_id == 7
    assert sent.reply_to == update["message"]["message_id"]


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("/status", "/status"),
        ("/compact 5", "/compact 5"),
        ("/new", "/new"),
        ("/stop", "/stop"),
        ("/help", "/help"),
        (f"/status@{BOT}", "/status"),
        (f"/compact@{BOT.upper()} 7", "/compact 7"),
        ("/start", "/help"),
        (f"/start@{BOT} deep-link", "/help"),
    ],
)
async def test_commands_reach_the_dispatcher_normalized(tmp_path: Path, typed: str, expected: str) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (_, sink):
        tg.push_message(typed)
        [message] = await sink.wait_for(1)
        assert message.text == expected


async def test_a_message_is_dated_by_telegram_and_says_so(tmp_path: Path) -> None:
    """Telegram's servers keep time: a machine clock days behind gives way to its date (bot/intake.py)."""
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (_, sink):
        tg.push_message("hello", date=1_800_000_000)
        [message] = await sink.wait_for(1)
    assert message.platform_date and message.timestamp.timestamp() == 1_800_000_000


async def test_a_command_for_another_bot_is_ignored(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (_, sink):
        tg.push_message("/status@SomeOtherBot")
        tg.push_message("sentinel")
        assert [m.text for m in await sink.wait_for(1)] == ["sentinel"]


async def test_edited_messages_and_bots_are_ignored(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (_, sink):
        tg.push_update({"edited_message": tg.user_message("edited text")})
        tg.push_message("I am a bot", is_bot=True)
        tg.push_message("sentinel")
        assert [m.text for m in await sink.wait_for(1)] == ["sentinel"]


async def test_a_channel_post_copied_into_its_discussion_group_is_not_answered(tmp_path: Path) -> None:
    """Each post of a channel linked to an allowed group (no mention needed) was answered there, as if
    a member named "Telegram" had said it: the copy comes from Telegram's service account (777000),
    which is no bot."""
    channel_chat = {"id": -1009, "type": "channel", "title": "News"}
    overrides = {"allowed_groups": [str(GROUP)], "groups": {str(GROUP): {"require_mention": False}}}
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, **overrides) as (_, sink):
        tg.push_message(
            "Our new release is out",
            chat_id=GROUP,
            chat_type="supergroup",
            user_id=777000,
            first_name="Telegram",
            sender_chat=channel_chat,
            is_automatic_forward=True,
            forward_origin={"type": "channel", "date": 1, "chat": channel_chat, "message_id": 5},
        )
        tg.push_message("sentinel", chat_id=GROUP, chat_type="supergroup")
        assert [m.text for m in await sink.wait_for(1)] == ["sentinel"]


async def test_an_anonymous_admin_of_an_allowed_group_is_answered(tmp_path: Path) -> None:
    """An admin who posts "as the group" comes from Telegram's GroupAnonymousBot (a bot account), with
    the group as ``sender_chat``: ignored like any bot, the group's own admins could not use the bot.
    Another chat posting in the group (a channel) is still not answered."""
    group_chat = {"id": GROUP, "type": "supergroup", "title": "Test group"}
    news = {"id": -1009, "type": "channel", "title": "News"}
    overrides = {"allowed_groups": [str(GROUP)], "groups": {str(GROUP): {"require_mention": False}}}
    anonymous = {"user_id": 1087968824, "first_name": "Group", "is_bot": True}
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, **overrides) as (_, sink):
        tg.push_message("as a channel", chat_id=GROUP, chat_type="supergroup", sender_chat=news, **anonymous)
        tg.push_message(
            "what is on today?",
            chat_id=GROUP,
            chat_type="supergroup",
            sender_chat=group_chat,
            author_signature="Chief",
            **anonymous,
        )
        tg.push_message(
            "no signature", chat_id=GROUP, chat_type="supergroup", sender_chat=group_chat, **anonymous
        )
        first, second = await sink.wait_for(2)
    assert (first.text, first.sender_name, first.sender_id, first.is_group) == (
        "what is on today?",
        "Chief",
        str(GROUP),
        True,
    )
    assert (second.text, second.sender_name) == ("no signature", "Anonymous admin")


async def test_split_paste_is_joined_and_a_command_is_not(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, join_window=0.3) as (_, sink):
        for part in ("part one", "part two", "part three"):
            tg.push_message(part)
        tg.push_message("/status")
        received = await sink.wait_for(2)
    assert [m.text for m in received] == ["part one\npart two\npart three", "/status"]


async def test_very_long_inbound_text_is_truncated_with_a_note(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, max_inbound_chars=200) as (_, sink):
        tg.push_message("x" * 3000)
        [message] = await sink.wait_for(1)
    assert message.text.startswith("x" * 200)
    assert "[message truncated: 3000 characters, limit 200]" in message.text


def long_reply() -> str:
    """About 10k characters: prose with emoji, a long code block, a list, more prose."""
    prose = " ".join(["Memory matters 🧠 for long chats — keep <tags> & ampersands escaped."] * 40)
    code = "\n".join(f"    print('line {i}: 😀 <b>not a tag</b> & more')  # comment" for i in range(90))
    items = "\n".join(f"- item **{i}** with `code {i}`" for i in range(30))
    return f"# Report\n\n{prose}\n\n```python\n{code}\n```\n\n{items}\n\n{prose}"


async def test_a_10k_reply_with_code_and_emoji_is_split_under_the_limit(tmp_path: Path) -> None:
    reply = long_reply()
    assert len(reply) > 10_000
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, RecordingSink(reply=reply)) as _:
        tg.push_message("write a report")
        await tg.wait_for(lambda: tg.calls_to("sendMessage") != [] and len(tg.sent_to(777)) >= 3)
        await asyncio.sleep(0.2)
        sent = tg.sent_to(777)
    assert len(tg.calls_to("sendMessage")) == len(sent)  # the fake rejected nothing (limits, HTML)
    assert all(m.parse_mode == "HTML" for m in sent)
    assert all(utf16_len(m.text) <= 4096 for m in sent)
    shown = "\n".join(m.text for m in sent)
    for i in range(90):
        assert f"print('line {i}: 😀 <b>not a tag</b> & more')" in shown
    code_chunks = [m for m in sent if "<pre>" in m.raw]
    assert len(code_chunks) >= 2, "the code block spans chunks"
    assert all('<pre><code class="language-python">' in m.raw for m in code_chunks)
    assert shown.count("item 29 with code 29") == 1


async def test_html_that_telegram_cannot_parse_is_resent_as_plain_text(tmp_path: Path) -> None:
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, RecordingSink(reply="**bold** move")) as _,
    ):
        tg.fail(
            "sendMessage",
            400,
            'Bad Request: can\'t parse entities: Unsupported start tag "b" at byte offset 0',
            when=lambda params: params.get("parse_mode") == "HTML",
        )
        tg.push_message("hi")
        [sent] = await tg.wait_for_messages(1)
    assert sent.parse_mode is None and sent.text == "**bold** move"


async def test_message_too_long_falls_back_to_smaller_plain_messages(tmp_path: Path) -> None:
    reply = "word " * 200
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, RecordingSink(reply=reply)) as _:
        tg.fail("sendMessage", 400, "Bad Request: message is too long", times=2)
        tg.push_message("hi")
        sent = await tg.wait_for_messages(2)
    assert all(m.parse_mode is None for m in sent)
    assert " ".join(m.text for m in sent).split() == reply.split()


async def test_429_retry_after_is_honoured(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, RecordingSink(reply="finally")) as _:
        tg.fail("sendMessage", 429, "Too Many Requests: retry after 1", retry_after=1)
        tg.push_message("hi")
        [sent] = await tg.wait_for_messages(1)
    assert sent.text == "finally"
    assert len(tg.calls_to("sendMessage")) == 2


async def test_5xx_is_retried_and_a_final_failure_is_raised_and_counted(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (channel, _):
        tg.fail("sendMessage", 502, "Bad Gateway", times=2)
        await channel.send(OutboundMessage("telegram", "777", "made it"))
        assert [m.text for m in tg.sent_to(777)] == ["made it"]

        tg.fail("sendMessage", 500, "Internal Server Error", times=100)
        with pytest.raises(ChannelError, match="777"):
            await channel.send(OutboundMessage("telegram", "777", "lost?"))
        assert channel.health.send_failures == 1
        assert len(tg.calls_to("sendMessage")) == 3 + 5  # 1 + max_retries (4) attempts


async def test_an_answer_sent_again_after_a_part_failed_sends_only_the_rest(tmp_path: Path) -> None:
    """A three-message answer whose second message failed was sent whole again: the first twice."""
    text = "\n\n".join(f"Paragraph {i}: " + "word " * 300 for i in range(9))
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (channel, _):
        tg.fail("sendMessage", 502, "Bad Gateway", times=100, when=lambda p: "Paragraph 3" in p["text"])
        with pytest.raises(ChannelError):
            await channel.send(OutboundMessage("telegram", "777", text, key="answer-1"))
        first = [m.text for m in tg.sent_to(777)]
        tg.failures.clear()
        await channel.send(
            OutboundMessage("telegram", "777", text, key="answer-1")
        )  # the dispatcher's resend
        texts = [m.text for m in tg.sent_to(777)]
    assert len(first) == 1 and len(texts) >= 3 and texts[0] == first[0]
    assert len(texts) == len(set(texts)) and " ".join(texts).split() == text.split()


async def test_typing_indicator_runs_while_a_turn_is_active(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (channel, _):
        async with channel.activity("-100123:7"):
            await tg.wait_for(lambda: len(tg.calls_to("sendChatAction")) >= 2)
        calls = tg.calls_to("sendChatAction")
    assert calls[0].params == {"chat_id": -100123, "action": "typing", "message_thread_id": 7}


async def test_streaming_edits_one_message_in_place(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, streaming=True) as (channel, _):
        show = channel.partial_sink("777")
        assert show is not None
        await show("Hel")
        await show("Hello **wor")
        await channel.send(OutboundMessage("telegram", "777", "Hello **world**"))
        [message] = tg.sent_to(777)
    assert message.raw == "Hello <b>world</b>" and message.edits == 2
    assert len(tg.calls_to("sendMessage")) == 1


async def test_a_streamed_message_deleted_before_the_answer_ends_gets_the_answer_anew(tmp_path: Path) -> None:
    """The final edit then fails ("message to edit not found"): the answer was kept until a restart."""
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, streaming=True) as (channel, _):
        show = channel.partial_sink("777")
        assert show is not None
        await show("The answer is")
        [partial] = tg.sent_to(777)
        del tg.messages[partial.message_id]  # the user deleted the half-written message
        await channel.send(OutboundMessage("telegram", "777", "The answer is forty-two."))
        assert [m.text for m in tg.sent_to(777)] == ["The answer is forty-two."]


async def test_a_command_answered_while_an_answer_streams_leaves_the_stream_alone(tmp_path: Path) -> None:
    """/status during a streamed answer took over its message: the status was lost, the answer twice."""
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, streaming=True) as (channel, _):
        show = channel.partial_sink("777")
        assert show is not None
        await show("The answer is")
        await channel.send(OutboundMessage("telegram", "777", "Model: test", aside=True))
        await show("The answer is forty")
        await channel.send(OutboundMessage("telegram", "777", "The answer is forty-two."))
        texts = [m.text for m in tg.sent_to(777)]
    assert texts == ["The answer is forty-two.", "Model: test"]


async def test_streaming_is_off_by_default(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (channel, _):
        assert channel.partial_sink("777") is None


async def test_command_menu_is_registered_only_when_it_changed(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg:
        async with running_channel(tg, tmp_path):
            pass
        async with running_channel(tg, tmp_path):
            pass
        assert len(tg.calls_to("setMyCommands")) == 1
        assert [(c["command"], c["description"]) for c in tg.commands] == COMMANDS
        COMMANDS.append(("memory", "Show memory"))
        try:
            async with running_channel(tg, tmp_path):
                pass
        finally:
            COMMANDS.pop()
        assert len(tg.calls_to("setMyCommands")) == 2


async def test_photo_without_vision_becomes_a_note(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, vision=False) as (_, sink):
        file_id = tg.add_file(b"\xff\xd8jpeg", "photos/a.jpg")
        photo = [{"file_id": file_id, "file_unique_id": "p1", "width": 90, "height": 90, "file_size": 6}]
        tg.push_message(None, photo=photo, caption="what is this?")
        [message] = await sink.wait_for(1)
    assert message.attachments == ()
    assert message.text.startswith("what is this?")
    assert "cannot see images" in message.text
    assert tg.calls_to("getFile") == []


async def test_documents_text_is_read_and_other_files_are_acknowledged(tmp_path: Path) -> None:
    async with (
        FakeTelegramServer() as tg,
        running_channel(tg, tmp_path, max_document_bytes=100) as (_, sink),
    ):
        notes = tg.add_file(b"# notes\nbuy milk\n", "documents/notes.md")
        blob = tg.add_file(b"\x00\x01", "documents/blob.bin")
        big = tg.add_file(b"x" * 500, "documents/big.txt")

        def document(file_id: str, name: str, mime: str, size: int) -> dict[str, object]:
            return {
                "file_id": file_id,
                "file_unique_id": f"u{file_id}",
                "file_name": name,
                "mime_type": mime,
                "file_size": size,
            }

        tg.push_message(None, document=document(notes, "notes.md", "text/markdown", 17))
        tg.push_message(None, document=document(blob, "blob.bin", "application/octet-stream", 2))
        tg.push_message(None, document=document(big, "big.txt", "text/plain", 500))
        received = await sink.wait_for(3)
    [text] = received[0].attachments
    assert (text.kind, text.name, text.data) == ("text", "notes.md", b"# notes\nbuy milk\n")
    [binary] = received[1].attachments
    assert (binary.kind, binary.name, binary.data, binary.size) == ("file", "blob.bin", b"", 2)
    [large] = received[2].attachments
    assert large.kind == "file" and "larger than 100 bytes" in received[2].text
    assert len(tg.calls_to("getFile")) == 1


async def test_a_file_that_cannot_be_downloaded_becomes_a_note(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, vision=True) as (_, sink):
        photo = [{"file_id": "gone", "file_unique_id": "g", "width": 9, "height": 9, "file_size": 9}]
        tg.push_message(None, photo=photo, caption="look")
        [message] = await sink.wait_for(1)
    assert message.attachments == ()
    assert message.text.startswith("look") and "could not be downloaded" in message.text


async def test_sends_to_one_chat_are_paced_after_a_short_burst(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, chat_interval=0.2) as (channel, _):
        loop = asyncio.get_running_loop()
        started = loop.time()
        for i in range(5):  # a burst of 3 goes at once, then one every 0.2 s
            await channel.send(OutboundMessage("telegram", "777", f"message {i}"))
        elapsed = loop.time() - started
        await channel.send(OutboundMessage("telegram", "778", "another chat is not held up"))
    assert elapsed >= 0.35
    assert [m.text for m in tg.sent_to(777)] == [f"message {i}" for i in range(5)]


async def test_a_rejected_token_is_a_clear_channel_error_that_does_not_repeat_it(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg:
        wrong = "111:AAOtherTokenOtherTokenOtherToken000"
        with pytest.raises(ChannelError, match="MEMBOT_TELEGRAM__TOKEN") as caught:
            async with running_channel(tg, tmp_path, token=wrong):
                pass
        assert wrong not in str(caught.value) and caught.value.__cause__ is None
        assert [c.method for c in tg.calls] == []  # the fake answered 401 before recording


async def test_stopping_hands_on_a_paste_still_in_its_join_window(tmp_path: Path) -> None:
    async with FakeTelegramServer() as tg:
        async with running_channel(tg, tmp_path, join_window=30.0) as (_, sink):
            tg.push_message("half a paste")
            # stored in the journal and confirmed, not yet handed on: it waits for the rest of the paste
            await tg.wait_for(lambda: any(c.params.get("offset") == 2 for c in tg.calls_to("getUpdates")))
            assert sink.received == []
        assert [m.text for m in sink.received] == ["half a paste"]


async def test_a_long_answer_cut_short_sends_only_the_rest_from_a_new_channel(tmp_path: Path) -> None:
    """The chunks Telegram took are on disk (``state/telegram_sent.json``): a channel started afresh on
    the same state, as after a kill, sends the same answer (same key) from the first chunk not taken."""
    text = "\n\n".join(f"PART-{n} " + "word " * 700 for n in (1, 2, 3))
    answer = OutboundMessage("telegram", "777", text, key="answer-1")
    async with FakeTelegramServer() as tg:
        tg.fail("sendMessage", 502, "Bad Gateway", times=100, when=lambda p: "PART-2" in str(p.get("text")))
        async with running_channel(tg, tmp_path) as (channel, _):
            with pytest.raises(ChannelError):
                await channel.send(answer)
        tg.failures.clear()
        async with running_channel(tg, tmp_path) as (channel, _):
            await channel.send(answer)
        assert [m.text.split()[0] for m in tg.sent_to(777)] == ["PART-1", "PART-2", "PART-3"]


@pytest.mark.parametrize("content", [b"not json", b'{"answers": [1]}', b"\xff\xfe"])
async def test_a_damaged_record_of_chunks_sent_does_not_stop_the_channel(
    tmp_path: Path, content: bytes
) -> None:
    (tmp_path / "telegram_sent.json").write_bytes(content)
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path, RecordingSink(reply="pong")):
        tg.push_message("ping")
        [sent] = await tg.wait_for_messages(1)
    assert sent.text == "pong"


async def test_a_send_telegram_answers_slowly_is_not_sent_again(tmp_path: Path) -> None:
    """Telegram took the message but answers after 6 s (a slow Bot API). A read timeout cannot tell that
    from a lost request, so a send that timed out is sent again: it must not time out that soon."""
    async with FakeTelegramServer() as tg, running_channel(tg, tmp_path) as (channel, _):
        tg.slow["sendMessage"] = 6.0
        await channel.send(OutboundMessage("telegram", "777", "the answer", key="answer-1"))
        assert [m.text for m in tg.sent_to(777)] == ["the answer"]
